"""MCP tool JSON through a call's checks (pure), and a stream's released events cut into pieces for
remote checks: tables and fuzz (any JSON, any events never crash; text and order kept)."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from adapters.internal import StreamEvent, StreamFinish, TextDelta, ToolCallDelta
from contracts.config.guardrails import GuardrailsConfig
from guardrails import CallGuard, GuardrailBlocked, PolicySet
from guardrails.stream import MAX_SEGMENTS, segments
from guardrails.tools import json_text, scan_json


def _guard() -> CallGuard:
    policies = PolicySet(GuardrailsConfig.model_validate({"policies": [{
        "name": "tools", "applies_to": {"tools": ["srv__*"]}, "checks": [
            {"type": "email", "action": "redact", "restore": True},
            {"type": "secret", "direction": "both"}]}]}))
    checks = policies.for_tool("t", "", "srv__echo")
    assert checks is not None and policies.for_tool("t", "", "other__echo") is None
    assert policies.for_call("t", "", "srv__echo") is None  # a model of that name is no tool
    return CallGuard(checks)


def test_arguments_redacted_results_restored_and_blocked() -> None:
    guard = _guard()
    args = {"to": "ana@example.com", "n": 3, "list": ["x", {"cc": "ana@example.com"}], "ok": True}
    out = scan_json(guard, args, "input")
    assert out == {"to": "[EMAIL_1]", "n": 3, "list": ["x", {"cc": "[EMAIL_1]"}], "ok": True}
    assert args["to"] == "ana@example.com"  # not changed in place
    result = {"content": [{"type": "text", "text": "sent to [EMAIL_1]"}], "isError": False}
    assert scan_json(guard, result, "output")["content"][0]["text"] == "sent to ana@example.com"
    same = {"content": [{"type": "text", "text": "nothing here"}]}
    assert scan_json(guard, same, "output") is same
    with pytest.raises(GuardrailBlocked):
        scan_json(guard, {"content": [{"text": "sk-proj-" + "Q" * 24}]}, "output")
    assert json_text({"a": "x", "b": [1, "y", {"c": "z"}]}) == "x\ny\nz"


_json: Any = st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=30),
                          lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner,
                                                                                         max_size=4), max_leaves=25)


@settings(max_examples=300, deadline=None)
@given(_json)
def test_fuzzed_json_never_crashes_and_keeps_its_shape(value: Any) -> None:
    guard = _guard()
    try:
        out = scan_json(guard, value, "input")
    except GuardrailBlocked:
        return
    assert type(out) is type(value)
    if isinstance(value, dict):
        assert list(out) == list(value)
    json_text(value)


def _text(events: list[StreamEvent]) -> str:
    return "".join(e.text for e in events if isinstance(e, TextDelta))


def test_segments_cut_at_spaces_near_the_size() -> None:
    events: list[StreamEvent] = [TextDelta("alpha beta gamma delta " * 4), ToolCallDelta(0, "{}"), StreamFinish("stop")]
    groups = segments(events, 24)
    assert _text([e for g in groups for e in g]) == "alpha beta gamma delta " * 4
    assert all(len(_text(g)) <= 24 for g in groups) and len(groups) >= 4
    assert all(_text(g).endswith(" ") for g in groups[:-1] if _text(g))  # whole words per piece
    assert isinstance(groups[-1][-1], StreamFinish)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.one_of(st.text(max_size=80).map(TextDelta), st.just(StreamFinish("stop")),
                          st.text(max_size=10).map(lambda t: TextDelta(t, refusal=True))), max_size=30),
       st.integers(1, 300))
def test_fuzzed_segments_keep_every_event_in_order(events: list[StreamEvent], size: int) -> None:
    groups = segments(events, size)
    flat = [e for g in groups for e in g]
    assert _text(flat) == _text(events)
    assert [e for e in flat if not isinstance(e, TextDelta) or e.refusal] == \
        [e for e in events if not isinstance(e, TextDelta) or e.refusal]
    total = sum(len(e.text) for e in events if isinstance(e, TextDelta) and not e.refusal)
    assert len([g for g in groups if _text([e for e in g if isinstance(e, TextDelta) and not e.refusal])]) \
        <= 2 * MAX_SEGMENTS + 1 or total == 0
