"""What every flow shares: the request's context and the `Flow` protocol a session drives.

A leaf of the request path: the session, the route table and the flows all import it, and it
imports none of them.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, NamedTuple, Protocol

import orjson

from contracts.config import TenantConfig
from contracts.envoy_names import TASK_ID_HEADER
from contracts.errors import ClientError
from contracts.keys import Caller
from extproc import messages as msg

if TYPE_CHECKING:  # only the composition root loads tracing, and only when it is configured
    from extproc.telemetry.tracing import RequestTrace

# The caller's protocol: its errors come back in this shape.
ClientProtocol = Literal["openai", "anthropic", "gemini", "responses", "kserve", "kserve-grpc", "mcp"]
# What `RequestContext.span` gives when tracing is off: one shared do-nothing context manager.
_NO_SPAN: AbstractContextManager[Any] = nullcontext()


class CallOutcome(NamedTuple):
    """What the call came to, once metered: the audit row reads it when the stream closes (a
    tuple: built once per call, a frozen dataclass's __init__ costs several times more)."""

    model: str
    cluster: str
    status: int
    input_tokens: int
    output_tokens: int


@dataclass(slots=True)
class RequestContext:
    """What the request headers told us; shared by every flow (slots: read on every step)."""

    task_id: str
    method: str
    path: str
    query: dict[str, str]
    headers: dict[str, str]
    protocol: ClientProtocol = "openai"
    started: float = field(default_factory=time.monotonic)
    tenant: TenantConfig | None = None
    # Who the key says is calling (a store key's id, narrowing and budget; None before authentication).
    caller: Caller | None = None
    admin: str = ""  # an admin API call's key digest (the audit row names its prefix)
    key_digest: str = ""  # the caller's key digest, once authenticated (per-key MCP tool lists)
    path_model: str | None = None
    path_version: str | None = None
    stream_hint: bool = False
    response_headers: list[tuple[str, str]] = field(default_factory=list)
    client: str = ""  # the caller's address as Envoy saw it
    requested_model: str | None = None  # from the body, for the audit row of a call refused before routing
    outcome: CallOutcome | None = None
    # Prefer: respond-async: validate, route and admit, then answer 202; a worker replays it later.
    deferred: bool = False
    # The task worker's replay of an accepted task: its request was counted when it was accepted.
    replayed: bool = False
    batch_line: bool = False  # a replay of one line of a batch: billed at the batch price (docs/batches.md)
    trace: RequestTrace | None = None  # set only when tracing is on (extproc.telemetry.tracing)
    # The replica picker's choice and reason (replica_metrics), for the audit row's detail.
    replica: dict[str, object] | None = None
    # Guardrail verdicts (policy, check, action, direction; never the matched text) for the audit row.
    guardrail_verdicts: list[dict[str, str]] | None = None
    # Routing that learns, for the audit row's detail: the bandit's arm and propensity, or the group breaker
    # that refused the call.
    routing: dict[str, object] | None = None

    def span(self, name: str, attributes: dict[str, Any] | None = None) -> AbstractContextManager[Any]:
        """A child span around a step when tracing is on (it yields the span); else a shared no-op
        (it yields None)."""
        return _NO_SPAN if self.trace is None or not self.trace.recording else self.trace.child(name, attributes)

    def task_headers(self) -> list[tuple[str, str]]:
        return [(TASK_ID_HEADER, self.task_id), *self.response_headers]

    @property
    def tenant_name(self) -> str:
        return self.tenant.name if self.tenant else "-"


@dataclass(frozen=True, slots=True)
class Interim:
    """A step that is not done yet: send `message` (a timeout extension) now, then await `then`."""

    message: msg.ProcessingResponse
    then: Callable[[], Awaitable[msg.ProcessingResponse | Interim]]


class Flow(Protocol):
    """The per-kind half of a session: everything after authentication."""

    # An Interim: the flow answers by itself after a wait it asks Envoy's timer for (an MCP call).
    async def request_body(self, body: bytes) -> msg.ProcessingResponse | Interim: ...
    # Awaitable where the answer needs a call first (a refused text batch's leader: docs/batching.md).
    def response_headers(self, status: int,
                         headers: dict[str, str]) -> msg.ProcessingResponse | Awaitable[msg.ProcessingResponse]: ...
    # Awaitable for a large buffered answer, translated in a worker thread (flows/offload.py).
    def response_body(self, chunk: bytes,
                      end_of_stream: bool) -> msg.ProcessingResponse | Awaitable[msg.ProcessingResponse]: ...
    def response_trailers(self, trailers: dict[str, str]) -> msg.ProcessingResponse: ...
    def defer(self) -> None: ...  # accepted as a task: release what admission took, meter nothing
    def close(self) -> None: ...


def json_response(status: int, payload: object, ctx: RequestContext) -> msg.ProcessingResponse:
    """An answer of the gateway's own (model lists, health), with the task headers."""
    return msg.immediate(status, orjson.dumps(payload), [("content-type", "application/json"), *ctx.task_headers()])


def json_object(body: bytes, shape: str = "") -> dict[str, Any]:
    """The body of a call the gateway answers itself, which must be one JSON object; else a 400 saying so."""
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError:
        doc = None
    if not isinstance(doc, dict):
        raise ClientError("the body must be a JSON object" + (f": {shape}" if shape else ""))
    return doc
