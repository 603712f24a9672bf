"""Budgets through a real Envoy, with the official SDKs: a tenant spends its budget and the next
call is 429 `insufficient_quota` (OpenAI) / `rate_limit_error` (Anthropic) with retry-after until
the period resets; a stream in flight when the budget runs out finishes and its cost counts; the
spend report equals the metering rows; the soft-limit webhook fires once per budget. One stack."""

from __future__ import annotations

import json
import math
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import anthropic
import openai
import pytest
from aiohttp import web

from contracts.config import hash_api_key
from tests.stack_config import small_config, start_stack
from tests.threaded_app import ThreadedApp

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(150)]

# $0.001 a token: "hello there" (2 words) gets "[demo-openai] echo: hello there" (4): $0.006 a call.
PRICE = {"input_per_1k": 1.0, "output_per_1k": 1.0}
CALL_USD = 0.006
TENANTS = {  # name: (key, budget)
    "tiny": ("sk-budget-tiny", {"usd": 0.025, "period": "day", "soft_share": 0.5}),
    "anthro": ("sk-budget-anthro", {"usd": 0.01, "period": "day"}),
    "streamer": ("sk-budget-stream", {"usd": 0.02, "period": "day"}),
    "roomy": ("sk-budget-roomy", {"usd": 100.0, "period": "month"}),  # never near its soft share
}
CHUNK_DELAY_S = 0.15
STORY = "tell me a long story about budgets that run out while a stream is still going on"


class Hooks:
    """The soft-limit webhook receiver."""

    def __init__(self) -> None:
        self.posts: list[dict[str, Any]] = []
        self.lock = threading.Lock()
        self.app = web.Application()
        self.app.router.add_post("/hook", self.hook)

    async def hook(self, request: web.Request) -> web.Response:
        body = await request.json()
        with self.lock:
            self.posts.append(body)
        return web.json_response({"ok": True})

    def of(self, id: str) -> list[dict[str, Any]]:
        with self.lock:
            return [p for p in self.posts if p["id"] == id]


@pytest.fixture(scope="module")
def hooks() -> Iterator[tuple[Hooks, int]]:
    h = Hooks()
    with ThreadedApp(h.app) as app:
        yield h, app.port


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory, hooks: tuple[Hooks, int]) -> Iterator[Any]:
    workdir = tmp_path_factory.mktemp("budgets")
    data = small_config()
    data["models"][0]["cost"] = PRICE
    data["extproc"]["metering_db"] = "metering.sqlite"
    data["tenants"] += [{"name": name, "tier": "L1", "api_keys": [f"sha256:{hash_api_key(key)}"], "budget": budget}
                        for name, (key, budget) in TENANTS.items()]
    data["keys"] = {"store": f"sqlite:///{workdir / 'keys.db'}", "budget_webhook": f"http://127.0.0.1:{hooks[1]}/hook"}
    s = start_stack(workdir, data)
    for child in s.children:  # streams take a while, so one can be in flight while the budget runs out
        if child.name.startswith("demo-"):
            child.argv += ["--chunk-delay", str(CHUNK_DELAY_S)]
    with s:
        yield s


def _oa(stack: Any, tenant: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{stack.url}/v1", api_key=TENANTS[tenant][0], max_retries=0, timeout=20)


def _until_midnight() -> float:
    now = datetime.now(UTC)
    return (datetime(now.year, now.month, now.day, tzinfo=UTC) + timedelta(days=1) - now).total_seconds()


def _hello(client: openai.OpenAI) -> None:
    r = client.chat.completions.create(model="demo-gpt", messages=[{"role": "user", "content": "hello there"}])
    assert r.usage is not None and (r.usage.prompt_tokens, r.usage.completion_tokens) == (2, 4)


def test_an_openai_caller_spends_its_budget_then_gets_insufficient_quota(stack: Any) -> None:
    client = _oa(stack, "tiny")
    for _ in range(5):  # $0.024 after four calls is under $0.025: the fifth is served
        _hello(client)
    with pytest.raises(openai.RateLimitError) as e:
        _hello(client)
    assert e.value.status_code == 429 and e.value.code == "insufficient_quota"
    body = e.value.response.json()
    assert body["error"]["type"] == "insufficient_quota" and body["error"]["param"] is None
    assert body["error"]["message"].startswith("budget exhausted: tenant 'tiny' spent $0.03 of its $0.025 budget")
    assert abs(int(e.value.response.headers["retry-after"]) - _until_midnight()) < 5
    assert len(e.value.response.headers["x-modelyard-task-id"]) == 32
    roomy = _oa(stack, "roomy")  # another tenant's budget is its own
    _hello(roomy)


def test_an_anthropic_caller_gets_its_own_429(stack: Any) -> None:
    client = anthropic.Anthropic(base_url=stack.url, api_key=TENANTS["anthro"][0], max_retries=0, timeout=20)

    def hi() -> None:
        r = client.messages.create(model="demo-gpt", max_tokens=50, messages=[{"role": "user", "content": "hi there"}])
        assert (r.usage.input_tokens, r.usage.output_tokens) == (2, 4)

    hi()
    hi()  # $0.012: past $0.01
    with pytest.raises(anthropic.RateLimitError) as e:
        hi()
    body = e.value.response.json()
    assert body["type"] == "error" and body["error"]["type"] == "rate_limit_error"
    assert "budget exhausted: tenant 'anthro'" in body["error"]["message"]
    assert abs(int(e.value.response.headers["retry-after"]) - _until_midnight()) < 5


def test_a_stream_in_flight_when_the_budget_runs_out_finishes_and_counts(stack: Any) -> None:
    client = _oa(stack, "streamer")
    started = time.monotonic()
    stream = client.chat.completions.create(model="demo-gpt", stream=True,
                                            messages=[{"role": "user", "content": STORY}])
    chunks = iter(stream)
    first = next(chunks)
    served = 0
    with pytest.raises(openai.RateLimitError) as e:
        for _ in range(10):
            _hello(client)
            served += 1
    assert served == 4 and e.value.code == "insufficient_quota"  # $0.018 admits a fourth; $0.024 does not
    refused_at = time.monotonic() - started
    # ... while the stream still runs: its 20 words take 20 x 0.15 s upstream
    assert refused_at < 20 * CHUNK_DELAY_S - 0.5, refused_at
    rest = list(chunks)
    text = "".join(c.choices[0].delta.content or "" for c in [first, *rest] if c.choices)
    assert text == f"[demo-openai] echo: {STORY}"
    assert [c.choices[0].finish_reason for c in rest if c.choices][-1] == "stop"
    db = Path(stack.cfg.extproc.metering_db)
    rows = _wait_rows(db, "streamer", 5)
    *calls, (story_in, story_out, story_cost) = sorted(rows, key=lambda r: r[2])
    assert calls == [(2, 4, pytest.approx(CALL_USD))] * 4
    assert story_in == len(STORY.split()) and story_out > 0 and story_cost == pytest.approx((story_in + story_out) / 1000)
    # The stream's cost is in the ledger too: the tenant stays refused (and is over its budget now).
    with pytest.raises(openai.RateLimitError) as again:
        _hello(client)
    assert f"spent ${4 * CALL_USD + story_cost:.6g}" in again.value.response.json()["error"]["message"]


def _wait_rows(db: Path, tenant: str, n: int, timeout: float = 10.0) -> list[tuple[int, int, float]]:
    """The tenant's metered (input tokens, output tokens, cost), once all `n` calls are written."""
    deadline = time.monotonic() + timeout
    while True:
        with sqlite3.connect(db) as conn:
            rows = conn.execute("SELECT input_tokens, output_tokens, cost FROM requests WHERE tenant = ?",
                                (tenant,)).fetchall()
        if len(rows) >= n or time.monotonic() > deadline:
            assert len(rows) == n, rows
            return rows
        time.sleep(0.05)


def test_the_spend_report_equals_the_metering_rows_and_the_ledger(stack: Any) -> None:
    db = Path(stack.cfg.extproc.metering_db)
    _wait_rows(db, "tiny", 5)
    _wait_rows(db, "anthro", 2)
    out = subprocess.run([sys.executable, "-m", "modelyard.cli", "spend", "--by", "tenant", "--json",
                          "--metering-db", str(db)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    report = {r["tenant"]: r for r in json.loads(out.stdout)}
    with sqlite3.connect(db) as conn:
        sql = {t: (n, tokens, usd) for t, n, tokens, usd in conn.execute(
            "SELECT tenant, COUNT(*), SUM(input_tokens + output_tokens), SUM(cost) FROM requests GROUP BY tenant")}
        costs: dict[str, list[float]] = {}
        for t, c in conn.execute("SELECT tenant, cost FROM requests"):
            costs.setdefault(t, []).append(c)
    assert set(report) == set(sql) and {"tiny", "anthro", "streamer", "roomy"} <= set(report)
    for tenant, (n, tokens, usd) in sql.items():
        row = report[tenant]
        assert (row["requests"], row["tokens"], row["key_id"], row["model"]) == (n, tokens, None, None)
        assert row["spend_usd"] == math.fsum(costs[tenant])  # the exactly rounded sum of the rows
        assert row["spend_usd"] == pytest.approx(usd, rel=1e-12, abs=0)  # SQLite's own running sum
    assert report["tiny"]["requests"] == 5 and report["tiny"]["spend_usd"] == pytest.approx(5 * CALL_USD)
    # The ledger enforcement reads holds the same spend (written by the extproc's sync thread).
    deadline = time.monotonic() + 5
    while True:
        with sqlite3.connect(Path(stack.workdir) / "keys.db") as conn:
            ledger = dict(conn.execute("SELECT id, SUM(usd) FROM budget_spend WHERE scope = 'tenant' GROUP BY id"))
        if all(ledger.get(t) == pytest.approx(report[t]["spend_usd"], rel=1e-9) for t in TENANTS):
            break
        assert time.monotonic() < deadline, (ledger, report)
        time.sleep(0.1)
    by_model = subprocess.run([sys.executable, "-m", "modelyard.cli", "spend", "--by", "model", "--since", "1h",
                               "--metering-db", str(db)], capture_output=True, text=True, timeout=60)
    assert by_model.returncode == 0 and "demo-gpt" in by_model.stdout, by_model.stderr
    with sqlite3.connect(db) as conn:  # refusals are decisions rows, beside the rate limiter's
        refused = conn.execute("SELECT tenant, limited_by FROM decisions WHERE store = 'budget' AND NOT allowed"
                               ).fetchall()
    assert {("tiny", "budget:tenant:tiny"), ("anthro", "budget:tenant:anthro"),
            ("streamer", "budget:tenant:streamer")} <= set(refused)


def test_the_soft_limit_webhook_fires_once_per_budget(stack: Any, hooks: tuple[Hooks, int]) -> None:
    receiver, _ = hooks
    deadline = time.monotonic() + 10
    while not all(receiver.of(t) for t in ("tiny", "anthro", "streamer")):
        assert time.monotonic() < deadline, receiver.posts
        time.sleep(0.1)
    _hello(_oa(stack, "roomy"))
    time.sleep(1.5)  # three more sync rounds: nothing is announced twice
    for tenant in ("tiny", "anthro", "streamer"):
        [post] = receiver.of(tenant)
        assert post["scope"] == "tenant" and post["tenant"] == tenant and post["period"] == "day"
        assert post["budget"] == TENANTS[tenant][1]["usd"]
        assert post["spend"] >= post["budget"] * post["soft_share"]
        now = datetime.now(UTC)
        midnight = datetime(now.year, now.month, now.day, tzinfo=UTC) + timedelta(days=1)
        assert post["reset"] == midnight.isoformat().replace("+00:00", "Z")
    assert receiver.of("roomy") == []
