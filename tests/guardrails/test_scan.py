"""A call's guard over the internal format: block, redact (consistent placeholders), log, restore;
streams held back a bounded window, with matches and placeholders split across chunks."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from adapters.internal import (
    ChatRequest,
    ChatResponse,
    Message,
    StreamEnd,
    StreamError,
    StreamEvent,
    StreamFinish,
    TextDelta,
    TextPart,
    ToolCall,
    ToolCallDelta,
    ToolCallStart,
)
from contracts.config.guardrails import GuardrailsConfig
from guardrails import CallGuard, GuardrailBlocked, PolicySet, StreamGuard, rewrite_json


def guard(*checks: dict[str, object], window: int = 16, tenant: str = "t") -> CallGuard:
    cfg = GuardrailsConfig.model_validate({"policies": [
        {"name": "p", "applies_to": {"tenants": [tenant]}, "window_chars": window, "checks": list(checks)}]})
    found = PolicySet(cfg).for_call("t", "", "m")
    assert found is not None
    return CallGuard(found)


def user(*texts: str) -> ChatRequest:
    return ChatRequest(model="m", messages=tuple(Message("user", (TextPart(t),)) for t in texts))


def test_policies_cover_by_tenant_key_or_model() -> None:
    cfg = GuardrailsConfig.model_validate({"policies": [
        {"name": "a", "applies_to": {"tenants": ["t1"]}, "checks": [{"type": "email"}]},
        {"name": "b", "applies_to": {"keys": ["k1"], "models": ["m2"]}, "checks": [{"type": "card"}]}]})
    ps = PolicySet(cfg)
    assert ps.for_call("t2", "", "m") is None
    t1 = ps.for_call("t1", "", "m")
    assert t1 is not None and [c.policy for c in t1.inputs] == ["a"]
    both = ps.for_call("t1", "k1", "m")
    assert both is not None and [c.policy for c in both.inputs] == ["a", "b"]
    m2 = ps.for_call("t3", "", "m2")
    assert m2 is not None and [c.name for c in m2.inputs] == ["card"]


def test_redaction_is_consistent_within_a_call() -> None:
    g = guard({"type": "email", "action": "redact"}, {"type": "card", "action": "redact"})
    out = g.request(user("a@x.io and b@y.io", "again a@x.io, card 4111 1111 1111 1111"))
    texts = [p.text for m in out.messages for p in m.content if isinstance(p, TextPart)]
    assert texts == ["[EMAIL_1] and [EMAIL_2]", "again [EMAIL_1], card [CARD_1]"]
    assert g.rewrites == {"a@x.io": "[EMAIL_1]", "b@y.io": "[EMAIL_2]", "4111 1111 1111 1111": "[CARD_1]"}
    assert {(v.check, v.action, v.direction) for v in g.verdicts} == {("email", "redact", "input"),
                                                                       ("card", "redact", "input")}


def test_unchanged_request_is_the_same_object() -> None:
    g = guard({"type": "email", "action": "redact"})
    req = user("nothing personal")
    assert g.request(req) is req and not g.verdicts


def test_block_names_policy_and_check_never_the_text() -> None:
    g = guard({"type": "secret", "name": "keys"})
    with pytest.raises(GuardrailBlocked) as e:
        g.request(user("use sk-proj-abcdefghijklmnopqrstuvwx123 please"))
    assert e.value.status == 400 and "'p'" in e.value.message and "'keys'" in e.value.message
    assert "sk-proj" not in e.value.message


def test_log_goes_on_and_counts() -> None:
    g = guard({"type": "email", "action": "log"})
    req = user("a@x.io b@x.io")
    assert g.request(req) is req
    assert list(g.verdicts.values()) == [2]


def test_size_limit() -> None:
    g = guard({"type": "size", "max_chars": 10})
    g.request(user("short"))
    with pytest.raises(GuardrailBlocked):
        g.request(user("a" * 11))


def test_overlapping_matches_leftmost_longest() -> None:
    g = guard({"type": "regex", "name": "ab", "pattern": "ab", "action": "redact"},
              {"type": "regex", "name": "abcd", "pattern": "abcd", "action": "redact"})
    assert g.scan("xabcdy ab", "input") == "x[ABCD_1]y [AB_1]"


def test_tool_call_arguments_are_checked() -> None:
    g = guard({"type": "email", "action": "redact", "direction": "both"})
    req = ChatRequest(model="m", messages=(Message("assistant", tool_calls=(ToolCall("c1", "f", '{"to": "a@x.io"}'),)),))
    out = g.request(req)
    assert out.messages[0].tool_calls[0].arguments == '{"to": "[EMAIL_1]"}'


def test_restore_round_trip_and_rewrites() -> None:
    g = guard({"type": "email", "action": "redact", "restore": True}, {"type": "card", "action": "redact"})
    g.request(user("mail a@x.io card 4111111111111111"))
    resp = ChatResponse(id="1", model="m", content="echo: mail [EMAIL_1] card [CARD_1] [EMAIL_9]")
    back = g.response(resp)
    assert back.content == "echo: mail a@x.io card [CARD_1] [EMAIL_9]"  # only restorable, only this call's
    body = b'{"choices":[{"message":{"content":"echo: mail [EMAIL_1] card [CARD_1]"}}],"model":"m"}'
    assert b"a@x.io" in rewrite_json(body, g.answer_rewrites())


def test_output_block_on_whole_answer() -> None:
    g = guard({"type": "regex", "name": "demo", "pattern": "DEMO-SECRET-\\d+", "direction": "output"})
    with pytest.raises(GuardrailBlocked):
        g.response(ChatResponse(id="1", model="m", content="the code is DEMO-SECRET-42"))


def run(g: CallGuard, pieces: list[str]) -> list[StreamEvent]:
    sg = StreamGuard(g)
    out: list[StreamEvent] = []
    for p in pieces:
        out += sg.feed([TextDelta(p)])
    out += sg.feed([StreamFinish("stop"), StreamEnd()], end=True)
    return out


def text_of(events: list[StreamEvent]) -> str:
    return "".join(e.text for e in events if isinstance(e, TextDelta))


def test_stream_restores_a_placeholder_split_across_chunks() -> None:
    g = guard({"type": "email", "action": "redact", "restore": True}, window=16)
    g.request(user("to a@x.io"))
    events = run(g, ["hello there, ", "my friend [EMA", "IL_1", "] and goodbye to all of you", " now"])
    assert text_of(events) == "hello there, my friend a@x.io and goodbye to all of you now"
    assert isinstance(events[-1], StreamEnd) and isinstance(events[-2], StreamFinish)


def test_stream_block_spanning_chunks_mid_stream() -> None:
    g = guard({"type": "regex", "name": "demo", "pattern": "DEMO-SECRET-\\d+", "direction": "output"}, window=16)
    words = ["word "] * 20 + ["DEMO-", "SEC", "RET-7", " more", " text"] + ["x "] * 10
    events = run(g, words)
    assert isinstance(events[-1], StreamError) and "'demo'" in events[-1].message
    sent = text_of(events)
    assert sent.startswith("word ") and "DEMO" not in sent
    assert not any(isinstance(e, StreamEnd) for e in events)


def test_stream_redacts_output_match_split_across_chunks() -> None:
    g = guard({"type": "email", "action": "redact", "direction": "output"}, window=32)
    assert text_of(run(g, ["write to bo", "b@exam", "ple.org today"])) == "write to [EMAIL_1] today"


@settings(max_examples=60, deadline=None)
@given(st.lists(st.text(max_size=20), max_size=30), st.integers(min_value=16, max_value=40))
def test_stream_guard_releases_exactly_the_text(pieces: list[str], window: int) -> None:
    g = guard({"type": "email", "action": "log", "direction": "output"}, window=window)
    assert text_of(run(g, pieces)) == "".join(pieces)


def test_stream_tool_call_arguments_held_whole_and_checked() -> None:
    g = guard({"type": "email", "action": "redact", "restore": True},
              {"type": "regex", "name": "demo", "pattern": "DEMO-SECRET-\\d+", "direction": "output"})
    g.request(user("to a@x.io"))
    sg = StreamGuard(g)
    out = sg.feed([TextDelta("calling"), ToolCallStart(0, "c1", "send"), ToolCallDelta(0, '{"to": "[EMA'),
                   ToolCallDelta(0, 'IL_1]"}')])
    out += sg.feed([StreamFinish("tool_calls"), StreamEnd()], end=True)
    assert [type(e).__name__ for e in out] == ["TextDelta", "ToolCallStart", "ToolCallDelta", "StreamFinish", "StreamEnd"]
    assert out[2] == ToolCallDelta(0, '{"to": "a@x.io"}')
    sg = StreamGuard(g)
    out = sg.feed([ToolCallStart(0, "c1", "send"), ToolCallDelta(0, '{"x": "DEMO-SEC'), ToolCallDelta(0, 'RET-1"}'),
                   StreamFinish("tool_calls")])
    assert len(out) == 1 and isinstance(out[0], StreamError)


def test_stream_block_whose_regex_needs_text_already_released() -> None:
    g = guard({"type": "regex", "name": "pw", "pattern": "(?<=password: )[a-z]+", "direction": "output"}, window=16)
    events = run(g, ["the password: ", "hunter"])
    assert isinstance(events[-1], StreamError) and "'pw'" in events[-1].message
    assert "hunter" not in text_of(events)


SCHEMA = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}


def test_structured_output_against_the_requests_schema_or_the_checks() -> None:
    from adapters.internal import ResponseFormat
    g = guard({"type": "json_schema", "direction": "output"})
    g.request(ChatRequest(model="m", messages=(), response_format=ResponseFormat("json_schema", SCHEMA)))
    g.response(ChatResponse(id="1", model="m", content='{"city": "Paris"}'))
    for bad in ('{"town": "Paris"}', "not json", '{"city": 3}'):
        with pytest.raises(GuardrailBlocked):
            g.response(ChatResponse(id="1", model="m", content=bad))
    free = guard({"type": "json_schema", "direction": "output"})
    free.request(user("no schema asked"))
    free.response(ChatResponse(id="1", model="m", content="prose is fine"))  # nothing to check against
    assert not free.holds_whole_answer()
    own = guard({"type": "json_schema", "direction": "output", "action": "log", "schema": SCHEMA})
    own.request(user("x"))
    own.response(ChatResponse(id="1", model="m", content="prose"))
    assert [v.action for v in own.verdicts] == ["log"]


def test_structured_stream_is_held_whole_then_checked() -> None:
    g = guard({"type": "json_schema", "direction": "output", "schema": SCHEMA})
    g.request(user("x"))
    assert text_of(run(g, ['{"ci', 'ty": "Pa', 'ris"}'])) == '{"city": "Paris"}'
    g = guard({"type": "json_schema", "direction": "output", "schema": SCHEMA})
    g.request(user("x"))
    sg = StreamGuard(g)
    assert sg.feed([TextDelta('{"town"')]) == []
    out = sg.feed([TextDelta(': "x"}'), StreamFinish("stop"), StreamEnd()], end=True)
    assert len(out) == 1 and isinstance(out[0], StreamError)


def test_bad_schema_is_refused_at_load() -> None:
    from contracts.config.guardrails import GuardCheck
    with pytest.raises(ValueError, match="not a valid JSON Schema"):
        GuardCheck.model_validate({"type": "json_schema", "direction": "output", "schema": {"type": 12}})


_WORDS = st.sampled_from(["hello", "ana@example.com", "bo.b@mail.example.org", "4111 1111 1111 1111", "x", "-",
                          "Zoë", "日本", "a@b", "+1 415 555 0100", "\n"])


@settings(max_examples=80, deadline=None)
@given(st.lists(_WORDS, min_size=1, max_size=40), st.data(), st.integers(min_value=16, max_value=64))
def test_a_restored_redaction_round_trips_through_any_chunking(words: list[str], data: st.DataObject,
                                                               window: int) -> None:
    g = guard({"type": "email", "action": "redact", "restore": True},
              {"type": "card", "action": "redact", "restore": True}, window=window)
    original = " ".join(words)
    sent = g.request(user(original)).messages[0].content[0]
    assert isinstance(sent, TextPart) and "ana@example.com" not in sent.text
    cuts = sorted(data.draw(st.lists(st.integers(0, len(sent.text)), max_size=12)))
    pieces = [sent.text[a:b] for a, b in zip([0, *cuts], [*cuts, len(sent.text)], strict=True)]
    assert text_of(run(g, pieces)) == original


@settings(max_examples=80, deadline=None)
@given(st.lists(st.text(max_size=40), max_size=5), st.text(max_size=60))
def test_no_request_crashes_a_guard(texts: list[str], system: str) -> None:
    g = guard({"type": "email", "action": "redact", "direction": "both"}, {"type": "phone", "action": "log"},
              {"type": "iban", "action": "redact"}, {"type": "secret"}, {"type": "deny", "words": ["é x"]},
              {"type": "size", "max_chars": 10_000})
    req = ChatRequest(model="m", system=system or None, messages=tuple(Message("user", (TextPart(t),)) for t in texts))
    try:
        g.request(req)
        g.response(ChatResponse(id="1", model="m", content="".join(texts)))
    except GuardrailBlocked as e:
        assert e.status == 400
