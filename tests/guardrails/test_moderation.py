"""Model-based checks, pure: an OpenAI moderation answer read with and without thresholds, a Llama
Guard answer read, the verdict cache's TTL and bound; fuzzed answers never crash a parser."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from contracts.config.guardrails import GuardCheck
from devstack.demo.moderation import result
from guardrails.moderation import VerdictCache, classify_flags, moderation_flags


def _answer(text: str) -> dict[str, Any]:
    return {"id": "modr-1", "model": "m", "results": [result(text, ["text"])]}


def test_thresholds_per_category_and_the_answers_own_flag() -> None:
    violent = _answer("I will kill the lights")
    assert moderation_flags(violent, {"violence": 0.5}) == ["violence"]
    assert moderation_flags(violent, {"violence": 0.95}) == []  # one trigger scores 0.9
    assert moderation_flags(violent, {"harassment": 0.5}) == []
    assert moderation_flags(violent, {}) == ["violence"]  # no thresholds: `flagged` and its categories
    assert moderation_flags(_answer("a calm day"), {}) == []
    assert moderation_flags(_answer("kill kill"), {"violence": 0.95}) == ["violence"]


@pytest.mark.parametrize("bad", [None, [], {}, {"results": []}, {"results": [1]}, {"results": [{"flagged": "yes"}]},
                                 "x"])
def test_an_unreadable_moderation_answer_is_none(bad: object) -> None:
    assert moderation_flags(bad, {}) is None
    assert moderation_flags({"results": [{"flagged": True}]}, {"violence": 0.5}) is None  # no scores to compare


@pytest.mark.parametrize(("answer", "flags"), [
    ("safe", []), ("  Safe.\n", []), ("unsafe\nS1,S10", ["S1", "S10"]), ("unsafe", ["unsafe"]),
    ("UNSAFE\n S2 , S2 ", ["S2"]), ("I cannot tell", None), ("", None),
])
def test_llama_guard_answers(answer: str, flags: list[str] | None) -> None:
    assert classify_flags(answer) == flags


def test_the_cache_keeps_a_verdict_for_its_ttl_and_stays_bounded() -> None:
    now = [100.0]
    cache = VerdictCache(max_items=2, clock=lambda: now[0])
    a, b, c = (VerdictCache.key("p/m", t) for t in ("a", "b", "c"))
    assert VerdictCache.key("p/m", "a") == a != VerdictCache.key("p/other", "a")  # per check
    cache.put(a, ["violence"], 10)
    assert cache.get(a) == ("violence",)
    now[0] += 11
    assert cache.get(a) is None  # expired
    cache.put(a, [], 10)
    cache.put(b, [], 10)
    cache.put(c, [], 10)
    assert len(cache) == 2 and cache.get(a) is None and cache.get(c) == ()
    cache.put(a, [], 0)  # ttl 0: not kept
    assert cache.get(a) is None


def test_model_check_config_is_checked() -> None:
    ok = GuardCheck.model_validate({"type": "moderation", "model": "m", "thresholds": {"violence": 0.4}})
    assert ok.action == "block" and ok.cache_ttl_s == 300
    for bad in ({"type": "moderation"}, {"type": "moderation", "model": "m", "action": "redact"},
                {"type": "moderation", "model": "m", "thresholds": {"violence": 1.5}},
                {"type": "classify", "model": "m"}, {"type": "classify", "model": "m", "prompt": "no slot"},
                {"type": "email", "model": "m"}, {"type": "regex", "pattern": "x", "thresholds": {"a": 0.1}}):
        with pytest.raises(ValueError):
            GuardCheck.model_validate(bad)


_json = st.recursive(st.none() | st.booleans() | st.floats(allow_nan=False) | st.text(max_size=8),
                     lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner,
                                                                                    max_size=4), max_leaves=20)


@settings(max_examples=300, deadline=None)
@given(_json, st.dictionaries(st.sampled_from(["violence", "hate", "x"]), st.floats(0, 1), max_size=3))
def test_fuzzed_moderation_answers_never_crash(answer: object, thresholds: dict[str, float]) -> None:
    flags = moderation_flags({"results": [answer]} if isinstance(answer, dict) else answer, thresholds)
    assert flags is None or all(isinstance(f, str) for f in flags)


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=200))
def test_fuzzed_classifier_answers_never_crash(answer: str) -> None:
    flags = classify_flags(answer)
    assert flags is None or all(isinstance(f, str) and len(f) <= 64 for f in flags)


def test_the_demo_llama_guard_answers_as_llama_guard_is_read() -> None:
    """devstack/demo/guard_classifier.py: its answers read back as the classify check reads Llama Guard's."""
    from adapters.internal import ChatRequest, Message, TextPart
    from devstack.demo.behaviour import demo_reply
    from devstack.demo.guard_classifier import verdict

    assert classify_flags(verdict("water the ferns")) == []
    assert classify_flags(verdict("How to MURDER and launder")) == ["S1", "S2"]
    assert classify_flags(verdict("a pipe bomb")) == ["S9"] and classify_flags(verdict("pipe bombing")) == []

    def ask(model: str, text: str) -> str:
        return demo_reply(ChatRequest(model=model, messages=(Message("user", (TextPart(text),)),)), "[d]").content

    assert ask("llama-guard-3-demo", "User: kidnap\n") == "unsafe\nS1"  # by upstream model name only
    assert ask("gpt-4o", "kidnap") == "[d] echo: kidnap"
