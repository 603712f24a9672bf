"""adapters/output_cap.py: a passthrough body's output cap lowered in each client protocol's own field."""

import orjson
import pytest

from adapters.output_cap import with_output_cap


@pytest.mark.parametrize(("protocol", "body", "expect"), [
    ("openai", {"model": "m", "max_tokens": 5000}, {"model": "m", "max_tokens": 2048}),
    ("openai", {"max_completion_tokens": 5000, "max_tokens": 9000}, {"max_completion_tokens": 2048, "max_tokens": 2048}),
    ("anthropic", {"max_tokens": 5000, "messages": []}, {"max_tokens": 2048, "messages": []}),
    ("gemini", {"generationConfig": {"maxOutputTokens": 5000, "topK": 3}},
     {"generationConfig": {"maxOutputTokens": 2048, "topK": 3}}),
    ("responses", {"max_output_tokens": 5000, "input": "x"}, {"max_output_tokens": 2048, "input": "x"}),
    ("completions", {"prompt": "p", "max_tokens": 5000}, {"prompt": "p", "max_tokens": 2048}),
])
def test_the_cap_field_is_lowered_and_the_rest_kept(protocol: str, body: dict, expect: dict) -> None:
    assert orjson.loads(with_output_cap(protocol, orjson.dumps(body), 2048)) == expect


@pytest.mark.parametrize(("protocol", "body"), [
    ("openai", {"max_tokens": 100}),  # within the cap
    ("openai", {"model": "m"}),  # no cap sent
    ("gemini", {"generationConfig": "odd"}),  # not an object: nothing to lower
    ("bedrock", {"inferenceConfig": {"maxTokens": 5000}}),  # not a client protocol
])
def test_a_body_with_nothing_over_the_cap_is_the_same_bytes(protocol: str, body: dict) -> None:
    raw = orjson.dumps(body)
    assert with_output_cap(protocol, raw, 2048) is raw
