"""The call every flow makes to its chosen deployment (`UpstreamCall`): the upstream request's
headers on the way out, and the outcome metered exactly once when the call ends.

Each flow says what is its own (path, body, the adapter's headers with the deployment's
credential); what every upstream call needs besides is built here: the deployment's credential
and cloud target (`authorize`), no client credential and none of our routing hints upstream, the
cluster Envoy routes on, the deadline, the task and tenant, the caller's trace.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping
from typing import Literal

from adapters.internal import Usage
from adapters.registry import CLIENT_AUTH_HEADERS
from contracts.envoy_names import (
    CHANNEL_HEADER,
    CLUSTER_HEADER,
    DESTINATION_ENDPOINT_HEADER,
    STRATEGY_HEADER,
    TASK_ID_HEADER,
    TENANT_HEADER,
    UPSTREAM_ATTEMPTS_HEADER,
    UPSTREAM_HOST_HEADER,
    UPSTREAM_TIMEOUT_HEADER,
)
from extproc import messages as msg
from extproc.admission.choice import Choice
from extproc.cloud_credentials import UpstreamAuth, upstream_auth
from extproc.context import RequestContext
from extproc.gateway import Gateway
from extproc.replicas.board import Sent
from extproc.replicas.picker import Pick

# No client credential and none of the caller's routing hints go upstream; the body must come
# back uncompressed for translation and metering.
STRIP_UPSTREAM = (*CLIENT_AUTH_HEADERS, "accept-encoding", STRATEGY_HEADER, CHANNEL_HEADER)
# The route stamps them on the answer for the extproc alone (failover); the caller never sees them.
ROUTE_ANSWER_HEADERS = (UPSTREAM_HOST_HEADER, UPSTREAM_ATTEMPTS_HEADER)

# How the deployment's timeout_ms reaches the call: Envoy's router header (it reads and strips
# it), or a gRPC upstream's own grpc-timeout (with `te: trailers`, which gRPC requires).
Deadline = Literal["router", "grpc"]


def upstream_error_status(status: int) -> int:
    """The client's fault stays a 4xx; the upstream's (or our credentials') becomes 502/504."""
    if status in (400, 404, 413, 422, 429):
        return 400 if status == 422 else status
    if status == 504:
        return 504
    return 502


class UpstreamCall:
    """One request's call to the deployment routing chose (`choice`, set by the flow when routed).

    `metered=False`: a translation hop's inner call, which the outer request meters as its own.
    `counts_output=False`: the call generates no tokens (embeddings): the trace reports none, not 0.
    """

    __slots__ = ("gw", "ctx", "choice", "auth", "finished", "metered", "counts_output", "replica", "pick")

    def __init__(self, gw: Gateway, ctx: RequestContext, *, metered: bool = True, counts_output: bool = True):
        self.gw = gw
        self.ctx = ctx
        self.choice: Choice | None = None
        self.auth = UpstreamAuth(None)  # the chosen deployment's credential (and cloud target), set by authorize
        self.finished = False
        self.metered = metered
        self.counts_output = counts_output
        self.replica: Sent | None = None  # the replica the picker sent this call to (replica_metrics)
        self.pick: Pick | None = None  # and why (routing explain, the audit's reasons)

    @property
    def pending(self) -> bool:
        """Routed and not yet metered: a stream that closes now was cut short."""
        return not self.finished and self.choice is not None

    # -- out ---------------------------------------------------------------------------------
    async def authorize(self) -> UpstreamAuth:
        """The routed deployment's credential and cloud target (AWS keys, a Google token), fetched
        or refreshed off the event loop; its adapter renders the request with them."""
        assert self.choice is not None  # routed first
        self.auth = await upstream_auth(self.choice.deployment)
        return self.auth

    def request(self, path: str, body: bytes, headers: Mapping[str, str] | None = None, *,
                cluster: str | None = None, deadline: Deadline | None = "router",
                extra: Iterable[tuple[str, str]] = (), strip: Iterable[str] = (),
                replace_body: bool = True, prompt: Callable[[], str] | None = None,
                adapter: str | None = None) -> msg.ProcessingResponse:
        """The request-body reply that sends the call: `headers` are the adapter's (credential
        included: a client header of that name stays, set to the deployment's); `cluster` defaults
        to the deployment's Envoy cluster, its failover aggregate where it has peers;
        `replace_body=False` keeps the client's bytes as they came. A deployment with
        `replica_metrics` gets the replica picked here (`prompt` gives the text prefix affinity
        hashes, `adapter` the LoRA the call needs)."""
        choice, ctx = self.choice, self.ctx
        assert choice is not None  # routed before anything goes upstream
        dep = choice.deployment
        own = headers or {}
        out = [*own.items(), (":path", path), ("content-length", str(len(body))),
               (CLUSTER_HEADER, cluster or self.gw.catalog.envoy_cluster(dep.cluster)),
               (TASK_ID_HEADER, ctx.task_id), (TENANT_HEADER, ctx.tenant.name if ctx.tenant else ""), *extra]
        remove = [h for h in STRIP_UPSTREAM if h not in own]
        if dep.replica_metrics is not None and self.gw.replicas is not None:
            self._pick_replica(dep.cluster, out, remove, prompt, adapter)
        if deadline == "router":
            out.append((UPSTREAM_TIMEOUT_HEADER, str(dep.timeout_ms)))
        elif deadline == "grpc":
            out += [("te", "trailers"), ("grpc-timeout", f"{dep.timeout_ms}m")]
        if ctx.trace is not None:  # the caller's trace goes on upstream, with our span as the parent
            out += ctx.trace.upstream_headers()
        return msg.request_body(out, [*remove, *strip], body=body if replace_body else None, clear_route_cache=True)

    def _pick_replica(self, cluster: str, out: list[tuple[str, str]], remove: list[str],
                      prompt: Callable[[], str] | None, adapter: str | None) -> None:
        board = self.gw.replicas
        assert board is not None
        pick, hashes = board.pick(cluster, adapter=adapter, prompt=prompt() if prompt is not None else None)
        self.pick = pick
        self.ctx.replica = pick.audit()
        if pick.endpoint is None:  # nothing fresh: Envoy balances, and no client may steer it
            remove.append(DESTINATION_ENDPOINT_HEADER)
            return
        out.append((DESTINATION_ENDPOINT_HEADER, pick.endpoint))
        self.replica = board.sent(cluster, pick.endpoint, hashes)

    def answered_by(self, host: str, attempts: str) -> None:
        """The route's stamp on the answer: an attempt before the last one failed on our pick; the
        audit row names the replica that answered where it is not the one picked (or none was)."""
        audit = self.ctx.replica
        if audit is not None and host and host != audit.get("replica"):
            audit["answered"] = host
        if self.replica is not None and attempts not in ("", "0", "1") and host != self.replica.endpoint:
            self._replica_done(failed=True)

    def _replica_done(self, *, failed: bool) -> None:
        if self.replica is not None and self.gw.replicas is not None:
            self.gw.replicas.done(self.replica, failed=failed)
        self.replica = None

    # -- the end -----------------------------------------------------------------------------
    def finish(self, status: int, *, upstream_ok: bool | None, usage: Usage | None = None,
               ttft_s: float | None = None, response_model: str | None = None,
               media: tuple[str, float] | None = None) -> None:
        """Meter the call's outcome, once: `status` is the caller's; `upstream_ok` None when the
        upstream never answered (a cut-short call is not held against the deployment)."""
        choice, ctx = self.choice, self.ctx
        if self.finished or choice is None:
            return
        self.finished = True
        if self.replica is not None:
            self._replica_done(failed=upstream_ok is False)
        if not self.metered:
            return
        self.gw.accountant.record_outcome(ctx, choice, status=status, upstream_ok=upstream_ok,
                                          latency_s=time.monotonic() - ctx.started, ttft_s=ttft_s, usage=usage,
                                          media=media)
        if ctx.trace is not None:
            ctx.trace.outcome(status, cluster=choice.deployment.cluster, tenant=ctx.tenant_name,
                              input_tokens=usage.input_tokens if usage else None,
                              output_tokens=usage.output_tokens if usage and self.counts_output else None,
                              response_model=response_model)

    def release(self) -> None:
        """Accepted as a task (Prefer: respond-async): give back what admission took; the replay
        is metered, not this acceptance."""
        self.finished = True
        self._replica_done(failed=False)
        if self.choice is not None:
            self.gw.accountant.release(self.choice)
