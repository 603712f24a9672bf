"""The semantic response cache through a real Envoy (issue 39): a paraphrase of a stored prompt is
answered from it (`x-modelyard-cache: semantic;score=0.91`, the demo upstream's request counter
unmoved), a prompt below the threshold goes upstream and is stored, another tenant never reads the
entry, and a stream replayed from a semantic hit parses in the anthropic and openai SDKs. The prompt
is embedded by the stack's own `demo-embed` (the demo OpenAI upstream's trigram embedder)."""

from __future__ import annotations

import sqlite3
import time

import anthropic
import httpx
import openai
import pytest

from tests.conftest import DEMO_KEY
from tests.e2e.metered import metered_row
from tests.e2e.semantic_stack import MODEL, semantic_config
from tests.stack_config import start_stack

pytestmark = pytest.mark.e2e
L2_KEY = "sk-modelyard-demo-l2"


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("semantic")
    data = semantic_config(tmp)
    with start_stack(tmp, data) as s:
        s.data = data
        yield s


def upstream_calls(data: dict) -> int:
    ep = data["models"][0]["deployments"][0]["endpoints"][0]
    return httpx.get(f"http://{ep}/stats", timeout=5).json()["requests"]


def _ask(stack, text: str, *, key: str = DEMO_KEY):
    raw = openai.OpenAI(base_url=f"{stack.url}/v1", api_key=key, max_retries=0).chat.completions.with_raw_response \
        .create(model=MODEL, max_tokens=64, messages=[{"role": "user", "content": text}])
    return raw.headers.get("x-modelyard-cache"), raw.parse(), raw.headers


def _stored(stack, timeout: float = 5.0) -> None:
    """Until the writer thread has committed one more vector (the next lookup reads the entry)."""
    path = stack.data["response_cache"]["sqlite_path"]
    deadline = time.monotonic() + timeout
    before = getattr(stack, "_vectors", 0)
    while True:
        with sqlite3.connect(path) as conn:
            n = conn.execute("SELECT COUNT(*) FROM vectors").fetchone()[0]
        if n > before:
            stack._vectors = n
            return
        assert time.monotonic() < deadline, "no vector stored"
        time.sleep(0.02)


def _score(verdict: str | None) -> float:
    assert verdict is not None and verdict.startswith("semantic;score="), verdict
    score = verdict.removeprefix("semantic;score=")
    assert len(score.split(".")[1]) == 2  # two decimals
    return float(score)


# Fixed prompts, each test its own topic: the demo embedder's similarities are deterministic (0.91 for
# the paraphrase, 0.82 for the Spain question, -0.05 across topics), never a margin left to chance.
def test_a_paraphrase_is_a_semantic_hit_and_a_far_prompt_a_miss(stack) -> None:
    text = "What is the capital city of France?"
    verdict, first, _ = _ask(stack, text)
    assert verdict == "miss" and first.choices[0].message.content == f"[demo-openai] echo: {text}"
    _stored(stack)
    calls = upstream_calls(stack.data)
    verdict, near, headers = _ask(stack, "what was the capital city of france")
    assert _score(verdict) == 0.91
    assert near.choices[0].message.content == first.choices[0].message.content  # the stored answer
    assert upstream_calls(stack.data) == calls  # no upstream call
    row = metered_row(stack, headers["x-modelyard-task-id"])
    assert row[0] == MODEL and row[5] == 0  # metered as a hit: no upstream cost
    verdict, far, _ = _ask(stack, "What is the capital city of Spain?")  # 0.82: below 0.85
    assert verdict == "miss" and far.choices[0].message.content.endswith("Spain?")
    assert upstream_calls(stack.data) == calls + 1
    _stored(stack)  # the miss's answer is stored with its vector: its own paraphrase now hits
    assert _ask(stack, "what is the capital city of spain")[0] == "semantic;score=1.00"


def test_another_tenant_never_reads_a_semantic_entry(stack) -> None:
    assert _ask(stack, "How many legs does a spider have?")[0] == "miss"
    _stored(stack)
    calls = upstream_calls(stack.data)
    verdict, _, _ = _ask(stack, "how many legs does a spider have", key=L2_KEY)
    assert verdict == "miss"  # tenant demo-l2: its own partition, so its own call upstream
    assert upstream_calls(stack.data) == calls + 1
    assert _ask(stack, "How many legs does a spider really have")[0] == "semantic;score=0.88"  # the owner hits
    _stored(stack)


def test_streams_replayed_from_a_semantic_hit_parse_in_both_sdks(stack) -> None:
    text = "Name three primary colours please"
    assert _ask(stack, text)[0] == "miss"
    _stored(stack)
    calls = upstream_calls(stack.data)
    claude = anthropic.Anthropic(base_url=stack.url, api_key=DEMO_KEY, max_retries=0)
    with claude.messages.stream(model=MODEL, max_tokens=64,
                                messages=[{"role": "user", "content": "name three primary colors please"}]) as s:
        assert s.response.headers["content-type"].startswith("text/event-stream")
        assert _score(s.response.headers["x-modelyard-cache"]) == 0.94
        assert "".join(s.text_stream) == f"[demo-openai] echo: {text}"
        assert s.get_final_message().stop_reason == "end_turn"
    oai = openai.OpenAI(base_url=f"{stack.url}/v1", api_key=DEMO_KEY, max_retries=0)
    chunks = list(oai.chat.completions.create(
        model=MODEL, max_tokens=64, stream=True, stream_options={"include_usage": True},
        messages=[{"role": "user", "content": "Name three primary colours, please!"}]))
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == f"[demo-openai] echo: {text}"
    assert chunks[-1].usage is not None and chunks[-1].usage.prompt_tokens > 0
    assert upstream_calls(stack.data) == calls
