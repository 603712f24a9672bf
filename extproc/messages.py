"""Builders for ext_proc `ProcessingResponse` messages (xds-protos, upb: the fast runtime).

Kept apart from the session so the decisions read as plain data and these stay the only place
that knows the proto's shape.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, TypeAlias

from envoy.config.core.v3 import base_pb2
from envoy.extensions.filters.http.ext_proc.v3 import processing_mode_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from envoy.type.v3 import http_status_pb2
from google.protobuf import duration_pb2

from contracts.envoy_names import EXT_PROC_FILTER, SOURCE_ADDRESS_ATTRIBUTE

ProcessingRequest: TypeAlias = pb.ProcessingRequest
ProcessingResponse: TypeAlias = pb.ProcessingResponse

Headers = Mapping[str, str]
HeaderPairs = Iterable[tuple[str, str]]

_OVERWRITE = base_pb2.HeaderValueOption.OVERWRITE_IF_EXISTS_OR_ADD


def header_map(headers: pb.HttpHeaders | pb.HttpTrailers) -> dict[str, str]:
    """Envoy sends values in `raw_value` (bytes) since 1.27; older builds use `value`."""
    hm = headers.headers if isinstance(headers, pb.HttpHeaders) else headers.trailers
    out: dict[str, str] = {}
    for h in hm.headers:
        raw = h.raw_value  # one read: each field access on a upb message builds a new object
        out[h.key] = raw.decode("utf-8", "replace") if raw else h.value
    return out


def fill_mutation(m: pb.HeaderMutation, set_headers: HeaderPairs = (), remove: Iterable[str] = ()) -> None:
    """Write the header changes into `m` in place: upb copies a submessage passed to a constructor
    or `append`, so building in place is about 2.5x faster on the request path."""
    if remove:
        m.remove_headers.extend(remove)
    add = m.set_headers.add
    for k, v in set_headers:
        h = add(append_action=_OVERWRITE).header
        h.key = k
        h.raw_value = v.encode()


def mutation(set_headers: HeaderPairs = (), remove: Iterable[str] = ()) -> pb.HeaderMutation:
    m = pb.HeaderMutation()
    fill_mutation(m, set_headers, remove)
    return m


def fill_common(c: pb.CommonResponse, set_headers: HeaderPairs = (), remove: Iterable[str] = (),
                body: bytes | None = None, clear_route_cache: bool = False) -> pb.CommonResponse:
    """The mutation of one reply step, written into `c` (a field of the reply being built)."""
    if clear_route_cache:
        c.clear_route_cache = True
    if set_headers or remove:
        fill_mutation(c.header_mutation, set_headers, remove)
    if body is not None:
        c.body_mutation.body = body
    return c


def _reply(kind: str) -> tuple[pb.ProcessingResponse, Any]:
    """A reply of `kind` (set even when it changes nothing) and its part to fill in."""
    r = pb.ProcessingResponse()
    part = getattr(r, kind)
    part.SetInParent()
    return r, part


def request_headers(set_headers: HeaderPairs = (), remove: Iterable[str] = (),
                    clear_route_cache: bool = False) -> pb.ProcessingResponse:
    r, part = _reply("request_headers")
    fill_common(part.response, set_headers, remove, clear_route_cache=clear_route_cache)
    return r


def request_body(set_headers: HeaderPairs = (), remove: Iterable[str] = (), body: bytes | None = None,
                 clear_route_cache: bool = False) -> pb.ProcessingResponse:
    r, part = _reply("request_body")
    fill_common(part.response, set_headers, remove, body, clear_route_cache)
    return r


def response_headers(set_headers: HeaderPairs = (), remove: Iterable[str] = (),
                     stream_body: bool = False, skip_body: bool = False) -> pb.ProcessingResponse:
    r, part = _reply("response_headers")
    fill_common(part.response, set_headers, remove)
    if stream_body:
        # SSE: hand each upstream chunk to us as it arrives instead of buffering the whole reply.
        r.mode_override.response_body_mode = processing_mode_pb2.ProcessingMode.STREAMED
    elif skip_body:
        # The body goes to the caller as the upstream sent it, never buffered nor shown to us.
        r.mode_override.response_body_mode = processing_mode_pb2.ProcessingMode.NONE
    return r


def response_headers_replacing_body(set_headers: HeaderPairs, remove: Iterable[str],
                                    body: bytes) -> pb.ProcessingResponse:
    """Headers mutated and `body` sent in place of the upstream's (CONTINUE_AND_REPLACE also adds
    a body to a headers-only answer, such as a trailers-only gRPC error)."""
    r, part = _reply("response_headers")
    c = fill_common(part.response, set_headers, remove, body)
    c.status = pb.CommonResponse.CONTINUE_AND_REPLACE
    return r


def response_body(set_headers: HeaderPairs = (), remove: Iterable[str] = (),
                  body: bytes | None = None) -> pb.ProcessingResponse:
    r, part = _reply("response_body")
    fill_common(part.response, set_headers, remove, body)
    return r


def replaced_body(body: bytes | None, status: int | None = None) -> pb.ProcessingResponse:
    """A buffered reply's body step: `body` in place of the upstream's (None: unchanged), with its
    length and, when the caller gets another status than the upstream sent, that status."""
    if body is None:
        return response_body()
    headers = [("content-length", str(len(body)))]
    if status is not None:
        headers.append((":status", str(status)))
    return response_body(headers, body=body)


def streamed_body(kind: str, body: bytes, end: bool) -> pb.ProcessingResponse:
    """A FULL_DUPLEX_STREAMED body reply (`kind`: request_body or response_body): these bytes go on in
    place of the message's, and `end` closes the body."""
    r = pb.ProcessingResponse()
    sr = getattr(r, kind).response.body_mutation.streamed_response
    sr.body = body
    sr.end_of_stream = end
    return r


def response_trailers(set_headers: HeaderPairs = (), remove: Iterable[str] = ()) -> pb.ProcessingResponse:
    r, part = _reply("response_trailers")
    fill_mutation(part.header_mutation, set_headers, remove)
    return r


def immediate(status: int, body: bytes, headers: HeaderPairs = (), details: str = "") -> pb.ProcessingResponse:
    return pb.ProcessingResponse(immediate_response=pb.ImmediateResponse(
        status=http_status_pb2.HttpStatus(code=status),
        headers=mutation(headers),
        body=body,
        details=details,
    ))


def client_address(req: pb.ProcessingRequest, headers: Headers) -> str:
    """The caller's address: Envoy's `source.address` attribute (its view after the trusted
    X-Forwarded-For hops), else the last X-Forwarded-For entry (the one Envoy appended)."""
    attrs = req.attributes.get(EXT_PROC_FILTER)
    if attrs is not None and SOURCE_ADDRESS_ATTRIBUTE in attrs.fields:
        return attrs.fields[SOURCE_ADDRESS_ATTRIBUTE].string_value
    return headers.get("x-forwarded-for", "").rpartition(",")[2].strip()


def reply_status(req: pb.ProcessingRequest, resp: pb.ProcessingResponse) -> int:
    """The HTTP status the caller gets from this exchange, when it says one (else 0)."""
    if resp.WhichOneof("response") == "immediate_response":
        return int(resp.immediate_response.status.code)
    if req.WhichOneof("request") == "response_headers":
        for h in req.response_headers.headers.headers:
            if h.key == ":status":
                return int(h.raw_value or h.value or 0)
    return 0


def body_sent(req: pb.ProcessingRequest, resp: pb.ProcessingResponse) -> bytes | None:
    """The response bytes this exchange passes on to the caller (after our mutation), if any."""
    kind = resp.WhichOneof("response")
    if kind == "immediate_response":
        return resp.immediate_response.body
    if kind == "response_body":
        c = resp.response_body.response
        return c.body_mutation.body if c.body_mutation.WhichOneof("mutation") == "body" else req.response_body.body
    if kind == "response_headers" and resp.response_headers.response.body_mutation.WhichOneof("mutation") == "body":
        return resp.response_headers.response.body_mutation.body
    return None


def extend_timeout(seconds: float) -> pb.ProcessingResponse:
    """Not an answer: asks Envoy for `seconds` more on the message it waits on (up to the filter's
    `max_message_timeout`), for a step that waits on purpose (a task long poll)."""
    d = duration_pb2.Duration()
    d.FromNanoseconds(int(seconds * 1e9))
    return pb.ProcessingResponse(override_message_timeout=d)
