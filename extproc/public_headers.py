"""Which `x-modelyard-*` response headers a caller may see: the documented ones (README), no others.

Internal headers (the answering upstream host and attempt count the route stamps for the
extproc, the tenant descriptor, anything an upstream sends under our prefix) say how the
gateway is built; `scrub` drops them from every reply the session sends, whichever flow or
error path produced it, so a new path cannot forget to.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable

from contracts.envoy_names import (
    ARM_HEADER,
    CACHE_HEADER,
    CHANNEL_HEADER,
    CLUSTER_HEADER,
    DROPPED_PARAMS_HEADER,
    MODEL_HEADER,
    OUTPUT_CLAMPED_HEADER,
    QUEUE_WAIT_HEADER,
    SPILLED_FROM_HEADER,
    STRATEGY_HEADER,
    TASK_ID_HEADER,
)
from extproc import messages as msg

PREFIX = "x-modelyard-"
PUBLIC_RESPONSE_HEADERS = frozenset({TASK_ID_HEADER, CLUSTER_HEADER, MODEL_HEADER, CHANNEL_HEADER, STRATEGY_HEADER,
                                     ARM_HEADER, QUEUE_WAIT_HEADER, DROPPED_PARAMS_HEADER, CACHE_HEADER,
                                     SPILLED_FROM_HEADER, OUTPUT_CLAMPED_HEADER})


# Any case: header names are case-insensitive, and one matched here is lowered before the check.
_PREFIXED = re.compile(re.escape(PREFIX), re.IGNORECASE).match


@functools.lru_cache(maxsize=4096)  # a dozen names per request, from a small set: one lookup each
def is_internal(name: str) -> bool:
    return _PREFIXED(name) is not None and name.lower() not in PUBLIC_RESPONSE_HEADERS


def _drop_internal(m: msg.pb.HeaderMutation, seen: Iterable[str]) -> None:
    """Remove what we were about to set and what arrived (`seen`) under internal names."""
    set_headers = m.set_headers
    if set_headers and any(is_internal(h.header.key) for h in set_headers):
        keep = [h for h in set_headers if not is_internal(h.header.key)]
        del set_headers[:]
        set_headers.extend(keep)
    arrived = {n.lower() for n in seen if is_internal(n)}
    if arrived:
        m.remove_headers.extend(sorted(arrived - set(m.remove_headers)))


def scrub(resp: msg.ProcessingResponse, seen: Iterable[str] = ()) -> msg.ProcessingResponse:
    """`resp` without internal `x-modelyard-*` headers on the way to the caller; `seen` holds the
    names of the response headers or trailers Envoy showed us. Request-side replies pass as is."""
    kind = resp.WhichOneof("response")
    if kind == "immediate_response":
        _drop_internal(resp.immediate_response.headers, ())
    elif kind == "response_headers":
        _drop_internal(resp.response_headers.response.header_mutation, seen)
    elif kind == "response_body":
        _drop_internal(resp.response_body.response.header_mutation, ())
    elif kind == "response_trailers":
        _drop_internal(resp.response_trailers.header_mutation, seen)
    return resp
