"""The Gateway's guardrail webhooks part (docs/guardrails.md): an operator's service asked about a
prompt, signed like the task webhooks, within the check's timeout; fail open or closed as configured.

aiohttp on the event loop (nothing blocks it); one client session, opened on first use."""

from __future__ import annotations

import asyncio
import logging
import os

import aiohttp
import orjson

from adapters.internal import ChatRequest, TextPart
from extproc.tasks.webhook import SIGNATURE_HEADER, signature
from guardrails import CallGuard, Check, GuardrailBlocked

log = logging.getLogger("modelyard.guardrails")


def payload(check: Check, req: ChatRequest, tenant: str, task_id: str) -> bytes:
    """What the service reads: who, which check, and the prompt's text as the model would get it."""
    messages = [{"role": m.role, "text": "".join(p.text for p in m.content if isinstance(p, TextPart))}
                for m in req.messages]
    return orjson.dumps({"policy": check.policy, "check": check.name, "direction": "input", "tenant": tenant,
                         "model": req.model, "task_id": task_id, "system": req.system or "", "messages": messages})


class GuardHooks:
    __slots__ = ("_session",)

    def __init__(self) -> None:
        self._session: aiohttp.ClientSession | None = None

    async def check_input(self, guard: CallGuard, req: ChatRequest, tenant: str, task_id: str) -> None:
        """Every webhook check of the call, at once; raises GuardrailBlocked for a block."""
        checks = guard.checks.webhooks
        if self._session is None:
            self._session = aiohttp.ClientSession()
        answers = await asyncio.gather(*(self._ask(c, payload(c, req, tenant, task_id), task_id) for c in checks))
        for check, verdict in zip(checks, answers, strict=True):
            if verdict == "allow":
                continue
            if verdict == "unavailable":
                assert check.webhook is not None
                if check.webhook.fail_open:
                    guard.note(check, "input", action="fail_open")
                    continue
                raise GuardrailBlocked(guard.note(check, "input", action="block"))
            if check.action == "block":
                raise GuardrailBlocked(guard.note(check, "input"))
            guard.note(check, "input")

    async def _ask(self, check: Check, body: bytes, task_id: str) -> str:
        hook = check.webhook
        assert hook is not None and self._session is not None
        secret = os.environ.get(hook.secret_env, "") if hook.secret_env else ""
        headers = {"content-type": "application/json", "x-modelyard-task-id": task_id}
        if secret:
            headers[SIGNATURE_HEADER] = signature(secret.encode(), body)
        try:
            async with self._session.post(hook.url, data=body, headers=headers,
                                          timeout=aiohttp.ClientTimeout(total=hook.timeout_s)) as r:
                answer = orjson.loads(await r.read()) if 200 <= r.status < 300 else None
        except (TimeoutError, aiohttp.ClientError, orjson.JSONDecodeError) as e:
            log.warning("guardrail %s/%s: webhook failed: %s", check.policy, check.name, type(e).__name__)
            return "unavailable"
        verdict = answer.get("verdict") if isinstance(answer, dict) else None
        if verdict not in ("allow", "block"):
            log.warning("guardrail %s/%s: webhook answered no verdict", check.policy, check.name)
            return "unavailable"
        return str(verdict)

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
