"""The audit row of one call, gathered while its ext_proc stream runs: who asked (after
authentication), what status and bodies went by, and what the call came to; written to the
audit log (extproc/telemetry/audit.py) when the stream closes."""

from __future__ import annotations

import time

from extproc import messages as msg
from extproc.context import RequestContext
from extproc.telemetry.audit import AUTH_FAILURE, CALL, AuditEvent, AuditLog
from extproc.telemetry.audit_chain import key_id


class CallTrail:
    """One call's audit row, gathered as its ext_proc stream goes and queued when it closes.

    Cheap when the tenant captures no bodies: a status read per exchange, nothing copied."""

    __slots__ = ("log", "checked", "status", "auth_failed", "key", "key_id", "capture", "request_body", "request_size",
                 "response_body", "response_size")

    def __init__(self, log: AuditLog):
        self.log = log
        self.checked = False  # public answers (health, 404 for unknown paths) are not calls
        self.status = 0
        self.auth_failed = False
        self.key: str | None = None
        self.key_id = ""
        self.capture = 0
        self.request_body: bytes | None = None
        self.request_size = 0
        self.response_body: bytearray | None = None
        self.response_size = 0

    def authenticated(self, ctx: RequestContext, key: str | None, digest: str | None = None) -> None:
        """Called once the key was looked up (a tenant, or None for a failure); `digest`: the key's
        sha256 hex digest when the caller has it (the key's id is its first 12 digits)."""
        self.checked = True
        self.key = key
        self.key_id = "" if not key else digest[:12] if digest else key_id(key)
        self.auth_failed = ctx.tenant is None
        if ctx.tenant is not None:
            self.capture = self.log.capture_limit(ctx.tenant.name)

    def saw(self, req: msg.ProcessingRequest, resp: msg.ProcessingResponse, status: int | None = None) -> None:
        """`status`: the upstream's :status when the caller already read it from these response headers."""
        if status is None:
            status = msg.reply_status(req, resp)
        if status:
            self.status = status
        if not self.capture:
            return
        if req.WhichOneof("request") == "request_body" and self.request_body is None:
            body = req.request_body.body
            self.request_body, self.request_size = body[:self.capture], len(body)
        sent = msg.body_sent(req, resp)
        if sent:
            if self.response_body is None:
                self.response_body = bytearray()
            room = self.capture - len(self.response_body)
            if room > 0:
                self.response_body += sent[:room]
            self.response_size += len(sent)

    def finish(self, ctx: RequestContext) -> None:
        out = ctx.outcome
        self.log.record(AuditEvent(
            event=AUTH_FAILURE if self.auth_failed else CALL, time=time.time(), task_id=ctx.task_id,
            tenant=ctx.tenant_name, key_id=self.key_id, client=ctx.client,
            method=ctx.method, path=ctx.path, model=out.model if out else (ctx.requested_model or ctx.path_model or ""),
            cluster=out.cluster if out else "", status=out.status if out else self.status,
            input_tokens=out.input_tokens if out else 0, output_tokens=out.output_tokens if out else 0,
            request_body=self.request_body, request_size=self.request_size,
            response_body=bytes(self.response_body) if self.response_body is not None else None,
            response_size=self.response_size,
            detail=({"reason": "unknown API key" if self.key else "missing API key"} if self.auth_failed
                    else _call_detail(ctx)),
            secrets=(self.key,) if self.key and self.capture else ()))


def _call_detail(ctx: RequestContext) -> dict[str, object] | None:
    """A call row's detail: the replica picker's choice (replica_metrics), the learning strategy's pick or
    the group breaker that refused it, and the guardrail verdicts."""
    if not ctx.guardrail_verdicts and ctx.routing is None:
        return ctx.replica
    out = {**(ctx.replica or {}), **(ctx.routing or {})}
    if ctx.guardrail_verdicts:
        out["guardrails"] = ctx.guardrail_verdicts
    return out
