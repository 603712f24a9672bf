"""Prompt-cache usage carried in every direction, plain and streamed, each protocol in its own fields
(issue 39): the golden `cached` cases of every pair (tests/adapters/golden/*/…-cached.json, inputs in
fixtures.py with their sources), and each protocol's usage reader and renderer as a table."""

from __future__ import annotations

import orjson
import pytest

from adapters.anthropic.usage import read_usage as anthropic_read
from adapters.anthropic.usage import render_usage as anthropic_render
from adapters.bedrock.usage import read_usage as bedrock_read
from adapters.bedrock.usage import render_usage as bedrock_render
from adapters.gemini.usage import read_usage as gemini_read
from adapters.gemini.usage import render_usage as gemini_render
from adapters.internal import CacheTokens, StreamEvent, Usage, UsageUpdate
from adapters.openai.usage import read_usage as openai_read
from adapters.openai.usage import render_usage as openai_render
from adapters.registry import PROTOCOLS
from adapters.responses.usage import read_usage as responses_read
from adapters.responses.usage import render_usage as responses_render
from tests.adapters.fixtures import CACHE_REPORTED, CACHED_IN, cache_seen_by
from tests.adapters.golden_pairs import Case, cases, render_response, translate
from tests.adapters.translation_checks import decode

RESPONSES, STREAMS = cases("response-cached"), cases("stream-cached")


def _triple(c: CacheTokens) -> tuple[int, int, int]:
    return c.read, c.write, c.write_1h


def _last_cache(events: list[StreamEvent]) -> CacheTokens:
    found = CacheTokens()
    for ev in events:
        if isinstance(ev, UsageUpdate) and ev.cache is not None:
            found = ev.cache
    return found


def test_every_pair_has_a_cached_case() -> None:
    assert len(RESPONSES) == len(STREAMS) == 12


@pytest.mark.parametrize("case", RESPONSES, ids=[c.id for c in RESPONSES])
def test_a_cached_answer_reaches_the_client_in_its_own_fields(case: Case) -> None:
    golden = case.load()
    reported = CACHE_REPORTED[case.upstream]
    upstream = PROTOCOLS[case.upstream].parse_response(orjson.dumps(golden["upstream"]))
    assert (upstream.usage.input_tokens, _triple(upstream.usage.cache)) == (CACHED_IN, reported)
    back = PROTOCOLS[case.client].parse_response(render_response(case.client, case.upstream, golden["upstream"]))
    assert (back.usage.input_tokens, _triple(back.usage.cache)) == (CACHED_IN, cache_seen_by(case.client, reported))


@pytest.mark.parametrize("case", STREAMS, ids=[c.id for c in STREAMS])
def test_a_cached_stream_reaches_the_client_and_the_meter(case: Case) -> None:
    golden = case.load()
    reported = CACHE_REPORTED[case.upstream]
    tr, out = translate(case.client, case.upstream, golden["upstream"].encode())
    assert _triple(tr.meter.reported.cache) == reported  # what metering prices
    assert _triple(_last_cache(decode(case.client, [out]))) == cache_seen_by(case.client, reported)


# ---- the pure readers and renderers, each protocol's documented fields ---------------------------

C = CacheTokens
# (reader, the provider's usage object, the hub's Usage). Anthropic and Bedrock count cache reads
# and writes outside input_tokens / inputTokens; OpenAI, Gemini and Responses inside.
READS = [
    ("openai", openai_read, {"prompt_tokens": 2006, "completion_tokens": 300, "total_tokens": 2306,
                             "prompt_tokens_details": {"cached_tokens": 1920}}, Usage(2006, 300, C(1920))),
    ("openai-no-details", openai_read, {"prompt_tokens": 5, "completion_tokens": 1}, Usage(5, 1)),
    ("anthropic", anthropic_read, {"input_tokens": 6, "cache_creation_input_tokens": 80,
                                   "cache_read_input_tokens": 1920, "output_tokens": 300,
                                   "cache_creation": {"ephemeral_5m_input_tokens": 30,
                                                      "ephemeral_1h_input_tokens": 50}},
     Usage(2006, 300, C(1920, 80, 50))),
    ("anthropic-zeros", anthropic_read, {"input_tokens": 69, "cache_creation_input_tokens": 0,
                                         "cache_read_input_tokens": 0, "output_tokens": 2}, Usage(69, 2)),
    ("gemini", gemini_read, {"promptTokenCount": 2006, "candidatesTokenCount": 290, "thoughtsTokenCount": 10,
                             "cachedContentTokenCount": 1920}, Usage(2006, 300, C(1920))),
    ("responses", responses_read, {"input_tokens": 2006, "output_tokens": 300,
                                   "input_tokens_details": {"cached_tokens": 1920, "cache_write_tokens": 80}},
     Usage(2006, 300, C(1920, 80))),
    # AWS Bedrock API reference, TokenUsage: cacheReadInputTokens / cacheWriteInputTokens beside inputTokens.
    ("bedrock", bedrock_read, {"inputTokens": 6, "outputTokens": 300, "totalTokens": 2306,
                               "cacheReadInputTokens": 1920, "cacheWriteInputTokens": 80}, Usage(2006, 300, C(1920, 80))),
    # TokenUsage.cacheDetails: the writes by TTL (CacheDetail: ttl 5m | 1h, inputTokens), 1h first.
    ("bedrock-cache-details", bedrock_read, {"inputTokens": 6, "outputTokens": 300, "totalTokens": 2306,
                                             "cacheReadInputTokens": 1920, "cacheWriteInputTokens": 80,
                                             "cacheDetails": [{"ttl": "1h", "inputTokens": 50},
                                                              {"ttl": "5m", "inputTokens": 30}]},
     Usage(2006, 300, C(1920, 80, 50))),
    ("bedrock-empty-details", bedrock_read, {"inputTokens": 6, "outputTokens": 1, "totalTokens": 7,
                                             "cacheDetails": []}, Usage(6, 1)),
]


@pytest.mark.parametrize(("name", "read", "raw", "usage"), READS, ids=[r[0] for r in READS])
def test_usage_readers(name: str, read: object, raw: dict, usage: Usage) -> None:
    assert read(raw) == usage  # type: ignore[operator]


HIT = Usage(2006, 300, C(1920, 80, 50))
RENDERS = [
    ("openai", openai_render(HIT), {"prompt_tokens": 2006, "completion_tokens": 300, "total_tokens": 2306,
                                    "prompt_tokens_details": {"cached_tokens": 1920}}),
    ("openai-miss", openai_render(Usage(5, 1)), {"prompt_tokens": 5, "completion_tokens": 1, "total_tokens": 6}),
    ("anthropic", anthropic_render(HIT), {"input_tokens": 6, "output_tokens": 300, "cache_creation_input_tokens": 80,
                                          "cache_read_input_tokens": 1920,
                                          "cache_creation": {"ephemeral_5m_input_tokens": 30,
                                                             "ephemeral_1h_input_tokens": 50}}),
    ("anthropic-miss", anthropic_render(Usage(5, 1)), {"input_tokens": 5, "output_tokens": 1}),
    ("gemini", gemini_render(HIT), {"promptTokenCount": 2006, "candidatesTokenCount": 300, "totalTokenCount": 2306,
                                    "cachedContentTokenCount": 1920}),
    ("responses", responses_render(HIT), {"input_tokens": 2006, "output_tokens": 300, "total_tokens": 2306,
                                          "input_tokens_details": {"cached_tokens": 1920, "cache_write_tokens": 80},
                                          "output_tokens_details": {"reasoning_tokens": 0}}),
    ("bedrock", bedrock_render(HIT), {"inputTokens": 6, "outputTokens": 300, "totalTokens": 2306,
                                      "cacheReadInputTokens": 1920, "cacheWriteInputTokens": 80,
                                      "cacheDetails": [{"ttl": "1h", "inputTokens": 50}, {"ttl": "5m", "inputTokens": 30}]}),
    ("bedrock-read-only", bedrock_render(Usage(2006, 300, C(1920))),
     {"inputTokens": 86, "outputTokens": 300, "totalTokens": 2306, "cacheReadInputTokens": 1920,
      "cacheWriteInputTokens": 0}),
]


@pytest.mark.parametrize(("name", "rendered", "expected"), RENDERS, ids=[r[0] for r in RENDERS])
def test_usage_renderers(name: str, rendered: object, expected: dict) -> None:
    assert rendered == expected


@pytest.mark.parametrize("proto", ["openai", "anthropic", "gemini", "responses", "bedrock"])
def test_a_cache_hit_survives_each_protocol_round_trip(proto: str) -> None:
    render, read = {"openai": (openai_render, openai_read), "anthropic": (anthropic_render, anthropic_read),
                    "gemini": (gemini_render, gemini_read), "responses": (responses_render, responses_read),
                    "bedrock": (bedrock_render, bedrock_read)}[proto]
    again = read(render(HIT))  # type: ignore[operator]
    assert (again.input_tokens, _triple(again.cache)) == (2006, cache_seen_by(proto, (1920, 80, 50)))


def test_bedrock_round_trip_keeps_reads_writes_and_1h_writes() -> None:
    assert bedrock_read(bedrock_render(HIT)) == Usage(2006, 300, C(1920, 80, 50))  # type: ignore[arg-type]
