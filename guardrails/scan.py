"""One call's guard: its checks run over the hub's internal format (adapters/internal.py), so every
client protocol gets the same checks. Pure: the chat flow calls it and renders what it raises.

A verdict names the policy, the check, the action and the side, never the matched text.
"""

from __future__ import annotations

import dataclasses
from typing import Literal, NamedTuple

from adapters.internal import ChatRequest, ChatResponse, Message, TextPart, ToolCall
from adapters.json_types import JSONObject
from contracts.errors import ClientError
from guardrails.policies import CallChecks, Check
from guardrails.structured import conforms
from guardrails.vault import Vault

Side = Literal["input", "output"]


class Verdict(NamedTuple):
    policy: str
    check: str
    action: str
    direction: Side


class GuardrailBlocked(ClientError):
    """A block: the caller learns which policy and check, never what matched."""

    def __init__(self, verdict: Verdict):
        what = "request" if verdict.direction == "input" else "answer"
        super().__init__(f"guardrail policy {verdict.policy!r} blocked this {what} (check {verdict.check!r})")
        self.verdict = verdict


class CallGuard:
    """The checks of one call, its placeholders and its verdicts (one per policy, check, action, side)."""

    __slots__ = ("checks", "vault", "verdicts", "rewrites", "out_rewrites", "request_schema")

    def __init__(self, checks: CallChecks) -> None:
        self.checks = checks
        self.vault = Vault()
        self.verdicts: dict[Verdict, int] = {}
        # What input redaction replaced (original -> placeholder): a same-protocol body gets the same.
        self.rewrites: dict[str, str] = {}
        self.out_rewrites: dict[str, str] = {}  # what output redaction replaced
        self.request_schema: JSONObject | None = None  # the structured output the request asked for

    def note(self, check: Check, side: Side, n: int = 1, action: str | None = None) -> Verdict:
        v = Verdict(check.policy, check.name, action or check.action, side)
        self.verdicts[v] = self.verdicts.get(v, 0) + n
        return v

    def scan(self, text: str, side: Side) -> str:
        """`text` after the side's checks: a block raises GuardrailBlocked; redactions are placeholders."""
        if not text:
            return text
        checks = self.checks.inputs if side == "input" else self.checks.outputs
        redact: list[tuple[int, int, Check]] = []
        blocked: Check | None = None
        for c in checks:
            if c.find is None:
                continue
            spans = c.find(text)
            if not spans:
                continue
            if c.action == "block":
                blocked = blocked or c
            elif c.action == "log":
                self.note(c, side, len(spans))
            else:
                redact += [(s, e, c) for s, e in spans]
        if blocked is not None:
            raise GuardrailBlocked(self.note(blocked, side))
        if not redact:
            return text
        redact.sort(key=lambda r: (r[0], r[0] - r[1]))  # leftmost, then longest, wins an overlap
        out: list[str] = []
        at = 0
        for s, e, c in redact:
            if s < at:
                continue
            value = text[s:e]
            ph = self.vault.placeholder(c.label, value, restore=c.restore)
            (self.rewrites if side == "input" else self.out_rewrites)[value] = ph
            self.note(c, side)
            out += (text[at:s], ph)
            at = e
        out.append(text[at:])
        return "".join(out)

    # -- input -----------------------------------------------------------------------------
    def request(self, req: ChatRequest) -> ChatRequest:
        """The request after the input checks (the same object when nothing changed)."""
        rf = req.response_format
        self.request_schema = rf.schema if rf is not None and rf.type == "json_schema" else None
        self._size(req)
        if not any(c.find is not None for c in self.checks.inputs):
            return req
        system = self.scan(req.system, "input") if req.system else req.system
        blocks = tuple(self._part(p) for p in req.system_blocks)
        messages = tuple(self._message(m) for m in req.messages)
        if system == req.system and blocks == req.system_blocks and messages == req.messages:
            return req
        return dataclasses.replace(req, system=system, system_blocks=blocks, messages=messages)

    def _size(self, req: ChatRequest) -> None:
        limits = [c for c in self.checks.inputs if c.max_chars is not None]
        if not limits:
            return
        chars = len(req.system or "") + sum(len(p.text) for m in req.messages for p in m.content if type(p) is TextPart)
        for c in limits:
            assert c.max_chars is not None
            if chars > c.max_chars:
                if c.action == "block":
                    raise GuardrailBlocked(self.note(c, "input"))
                self.note(c, "input")

    def _part(self, p: TextPart) -> TextPart:
        text = self.scan(p.text, "input")
        return p if text == p.text else dataclasses.replace(p, text=text)

    def _message(self, m: Message) -> Message:
        content = tuple(self._part(p) if type(p) is TextPart else p for p in m.content)
        calls = tuple(self._call(tc, "input") for tc in m.tool_calls)
        if content == m.content and calls == m.tool_calls:
            return m
        return dataclasses.replace(m, content=content, tool_calls=calls)

    def _call(self, tc: ToolCall, side: Side) -> ToolCall:
        args = self.scan(tc.arguments, side)
        if side == "output":
            args = self.vault.restore(args)
        return tc if args == tc.arguments else dataclasses.replace(tc, arguments=args)

    # -- output ----------------------------------------------------------------------------
    def response(self, resp: ChatResponse) -> ChatResponse:
        """The answer after the output checks, with this call's restorable placeholders put back."""
        self.structured(resp.content)
        content = self.vault.restore(self.scan(resp.content, "output"))
        refusal = self.vault.restore(self.scan(resp.refusal, "output")) if resp.refusal else resp.refusal
        calls = tuple(self._call(tc, "output") for tc in resp.tool_calls)
        if content == resp.content and refusal == resp.refusal and calls == resp.tool_calls:
            return resp
        return dataclasses.replace(resp, content=content, refusal=refusal, tool_calls=calls)

    def holds_whole_answer(self) -> bool:
        """A structured-output check applies: a stream's text is held to its end and checked whole."""
        return any(c.structured and (c.schema or self.request_schema) for c in self.checks.outputs)

    def structured(self, text: str) -> None:
        """The json_schema checks on a whole answer: a block raises, a log notes."""
        for c in self.checks.outputs:
            schema = (c.schema or self.request_schema) if c.structured else None
            if schema is None or conforms(schema, text):
                continue
            if c.action == "block":
                raise GuardrailBlocked(self.note(c, "output"))
            self.note(c, "output")

    def answer_rewrites(self) -> dict[str, str]:
        """Old text -> new text of what `response` changed, for a same-protocol body rewritten in place."""
        return {**self.out_rewrites, **self.vault.restorable()}
