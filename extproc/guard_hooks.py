"""The Gateway's remote guardrail checks (docs/guardrails.md): an operator's webhook (signed like the
task webhooks), a moderation deployment (OpenAI's `/v1/moderations`) or a classification model (a chat
model with the operator's prompt), each within the check's timeout; fail open or closed as configured.

aiohttp on the event loop (nothing blocks it): one client session, opened on first use; the checks of
one call run at once; at most `MAX_IN_FLIGHT` calls to one model at a time (waiting for a turn counts
against the check's timeout); a model's verdict per distinct text is remembered for `cache_ttl_s`.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Sequence

import aiohttp
import orjson

from adapters.internal import ChatRequest, Message, RenderOptions, TextPart
from adapters.registry import PROTOCOLS
from contracts.config import Deployment, GatewayConfig
from contracts.errors import ModelyardError
from extproc.cloud_credentials import upstream_auth
from extproc.context import RequestContext
from extproc.tasks.webhook import SIGNATURE_HEADER, signature
from extproc.telemetry.metrics import GUARDRAIL_VERDICTS
from guardrails import CallGuard, Check, GuardrailBlocked
from guardrails.moderation import (
    VerdictCache,
    as_object,
    classify_flags,
    classify_prompt,
    moderation_flags,
    moderation_request,
)
from guardrails.scan import Side

log = logging.getLogger("modelyard.guardrails")

MAX_IN_FLIGHT = 64  # calls to one moderation or classification model at once, from this process
MAX_CHECKED_CHARS = 32_768  # a model is asked about a text's head at most (moderation models cap their input)
_UNAVAILABLE = "unavailable"


def prompt_text(req: ChatRequest) -> str:
    """The prompt as one text (system and messages), as the model gets it after this call's redactions."""
    parts = [req.system or ""]
    parts += ["".join(p.text for p in m.content if isinstance(p, TextPart)) for m in req.messages]
    return "\n".join(p for p in parts if p)


def payload(check: Check, side: Side, tenant: str, model: str, task_id: str, *, req: ChatRequest | None = None,
            text: str = "", offset: int = 0) -> bytes:
    """What a webhook reads: who, which check, and the prompt (input) or the answer's text (output;
    a stream's text comes a released segment at a time, `offset` characters into the answer)."""
    doc: dict[str, object] = {"policy": check.policy, "check": check.name, "direction": side, "tenant": tenant,
                              "model": model, "task_id": task_id}
    if req is not None:
        doc["system"] = req.system or ""
        doc["messages"] = [{"role": m.role, "text": "".join(p.text for p in m.content if isinstance(p, TextPart))}
                           for m in req.messages]
    else:
        doc["text"] = text
        doc["offset"] = offset
    return orjson.dumps(doc)


def record(guard: CallGuard, ctx: RequestContext) -> None:
    """The verdicts so far as metrics (once each) and on the context for the call's audit row."""
    seen = ctx.guardrail_verdicts
    if seen is None:
        seen = ctx.guardrail_verdicts = []
    for v in guard.verdicts:
        row = {"policy": v.policy, "check": v.check, "action": v.action, "direction": v.direction}
        if row in seen:
            continue
        seen.append(row)
        GUARDRAIL_VERDICTS.labels(v.policy, v.check, v.action, v.direction).inc()


class GuardHooks:
    __slots__ = ("_session", "_cache", "_gates")

    def __init__(self) -> None:
        self._session: aiohttp.ClientSession | None = None
        self._cache = VerdictCache()
        self._gates: dict[str, asyncio.Semaphore] = {}

    async def check_input(self, guard: CallGuard, req: ChatRequest, tenant: str, task_id: str,
                          config: GatewayConfig | None = None) -> None:
        """Every remote input check of the call, at once; raises GuardrailBlocked for a block."""
        checks = guard.checks.remote_inputs
        text = prompt_text(req) if any(c.remote is not None and c.remote.kind != "webhook" for c in checks) else ""
        bodies = [payload(c, "input", tenant, req.model, task_id, req=req) for c in checks]
        await self._decide(guard, checks, "input", text, bodies, task_id, config)

    async def check_output(self, guard: CallGuard, text: str, model: str, tenant: str, task_id: str,
                           config: GatewayConfig | None = None, offset: int = 0) -> None:
        """Every remote output check on `text` (a whole answer, or a stream's released segment)."""
        await self.check_text(guard, "output", text, model, tenant, task_id, config, offset)

    async def check_text(self, guard: CallGuard, side: Side, text: str, model: str, tenant: str, task_id: str,
                         config: GatewayConfig | None = None, offset: int = 0) -> None:
        """Every remote check of `side` on `text` (an answer, a stream's segment, an MCP tool call's strings)."""
        if not text.strip():
            return
        checks = guard.checks.remote_inputs if side == "input" else guard.checks.remote_outputs
        bodies = [payload(c, side, tenant, model, task_id, text=text, offset=offset) for c in checks]
        await self._decide(guard, checks, side, text, bodies, task_id, config)

    async def _decide(self, guard: CallGuard, checks: Sequence[Check], side: Side, text: str, bodies: list[bytes],
                      task_id: str, config: GatewayConfig | None) -> None:
        if self._session is None:
            self._session = aiohttp.ClientSession()
        answers = await asyncio.gather(*(self._ask(c, body, text, task_id, config)
                                         for c, body in zip(checks, bodies, strict=True)))
        blocked = None
        for check, verdict in zip(checks, answers, strict=True):
            if verdict == "allow":
                continue
            if verdict == _UNAVAILABLE:
                assert check.remote is not None
                if check.remote.fail_open:
                    guard.note(check, side, action="fail_open")
                    continue
                blocked = blocked or guard.note(check, side, action="block")
            elif check.action == "block":
                blocked = blocked or guard.note(check, side)
            else:
                guard.note(check, side)
        if blocked is not None:
            raise GuardrailBlocked(blocked)

    async def _ask(self, check: Check, body: bytes, text: str, task_id: str, config: GatewayConfig | None) -> str:
        remote = check.remote
        assert remote is not None
        try:
            if remote.kind == "webhook":
                return await self._webhook(check, body, task_id)
            return await self._model(check, text[:MAX_CHECKED_CHARS], config)
        except (TimeoutError, aiohttp.ClientError, ModelyardError, ValueError) as e:
            log.warning("guardrail %s/%s: %s failed: %s", check.policy, check.name, remote.kind, type(e).__name__)
            return _UNAVAILABLE
        except Exception:  # a credential helper's or an adapter's own failure: the check's `fail` decides, traced
            log.warning("guardrail %s/%s: %s failed", check.policy, check.name, remote.kind, exc_info=True)
            return _UNAVAILABLE

    async def _webhook(self, check: Check, body: bytes, task_id: str) -> str:
        hook = check.remote
        assert hook is not None and hook.url is not None and self._session is not None
        secret = os.environ.get(hook.secret_env, "") if hook.secret_env else ""
        headers = {"content-type": "application/json", "x-modelyard-task-id": task_id}
        if secret:
            headers[SIGNATURE_HEADER] = signature(secret.encode(), body)
        async with self._session.post(hook.url, data=body, headers=headers,
                                      timeout=aiohttp.ClientTimeout(total=hook.timeout_s)) as r:
            answer = as_object(await r.read()) if 200 <= r.status < 300 else None
        verdict = answer.get("verdict") if answer is not None else None
        if verdict not in ("allow", "block"):
            log.warning("guardrail %s/%s: webhook answered no verdict", check.policy, check.name)
            return _UNAVAILABLE
        return str(verdict)

    async def _model(self, check: Check, text: str, config: GatewayConfig | None) -> str:
        """A moderation or classification model's verdict on `text` (remembered per text for the TTL)."""
        remote = check.remote
        assert remote is not None and remote.model is not None
        if not text.strip():
            return "allow"
        key = VerdictCache.key(repr(remote), text)  # the model, thresholds and prompt: a reload that changes one asks anew
        flags = self._cache.get(key)
        if flags is None:
            dep = _deployment(config, remote.model, moderation=remote.kind == "moderation")
            gate = self._gates.setdefault(remote.model, asyncio.Semaphore(MAX_IN_FLIGHT))
            async with asyncio.timeout(remote.timeout_s):
                async with gate:
                    found = await (self._moderate(dep, remote.model, text, dict(remote.thresholds))
                                   if remote.kind == "moderation" else self._classify(dep, remote.model, text,
                                                                                      remote.prompt or "{text}"))
            if found is None:
                log.warning("guardrail %s/%s: %s answered nothing readable", check.policy, check.name, remote.model)
                return _UNAVAILABLE
            self._cache.put(key, found, remote.cache_ttl_s)
            flags = tuple(found)
        return "block" if flags else "allow"

    async def _moderate(self, dep: Deployment, model: str, text: str, thresholds: dict[str, float]) -> list[str] | None:
        auth = await upstream_auth(dep)
        headers = {"content-type": "application/json"}
        if auth.credential:
            headers["authorization"] = "Bearer " + auth.credential
        assert self._session is not None
        async with self._session.post(_base(dep) + "/v1/moderations", headers=headers,
                                      data=moderation_request(dep.upstream_model or model, text)) as r:
            answer = as_object(await r.read()) if 200 <= r.status < 300 else None
        return moderation_flags(answer, thresholds)

    async def _classify(self, dep: Deployment, model: str, text: str, prompt: str) -> list[str] | None:
        auth = await upstream_auth(dep)
        proto = PROTOCOLS[dep.protocol]
        req = ChatRequest(model=model, messages=(Message("user", (TextPart(classify_prompt(prompt, text)),)),),
                          max_tokens=32, temperature=0.0)
        up = proto.render_request(req, upstream_model=dep.upstream_model or model, credential=auth.credential,
                                  options=RenderOptions(legacy_max_tokens=dep.max_tokens_field == "max_tokens",
                                                        cloud=auth.cloud))
        assert self._session is not None
        async with self._session.post(_base(dep) + up.path, headers=dict(up.headers), data=up.body) as r:
            body = await r.read()
            if not 200 <= r.status < 300:
                return None
        return classify_flags(proto.parse_response(body).content)

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()


def _deployment(config: GatewayConfig | None, model: str, *, moderation: bool) -> Deployment:
    """The first deployment of the checking model (moderation: one speaking OpenAI's API)."""
    found = config.model(model) if config is not None else None
    for dep in found.deployments if found is not None else ():
        if not moderation or dep.protocol == "openai":
            return dep
    raise ValueError(f"no deployment of {model!r} can answer")


def _base(dep: Deployment) -> str:
    return ("https://" if dep.tls else "http://") + dep.endpoints[0]
