"""Budgets on the request path, driven through a Session with plain ext_proc messages: a spent
budget (the tenant's, or a stored key's carried by its Caller) refuses before any upstream with 429
in the caller's protocol and retry-after until the period resets; spend from other processes
arrives through the shared ledger; a call's cost counts for its key and tenant; the soft share is
announced once across processes."""

from __future__ import annotations

import asyncio
import sqlite3
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import orjson
import pytest
import yaml

from budgets.periods import day_of
from budgets.store import SpendStore
from contracts.config import parse_config
from contracts.config.keys import Budget
from contracts.keys import Caller
from extproc.admission.budget_guard import BudgetGuard
from extproc.gateway import Gateway
from extproc.session import Session
from extproc.telemetry.metering import MeteringStore
from extproc.telemetry.metrics import BUDGET_SOFT_CROSSINGS, BUDGET_USED
from tests.core.session_driver import KEY, ROOT, ROUTES, body_msg, chat_headers, headers_msg
from tests.stack_config import without_watermarks

NOW = datetime(2026, 12, 3, 18, 0, tzinfo=UTC).timestamp()  # a Thursday, 6 h before midnight UTC
TODAY = day_of(NOW)
ANTHROPIC = {":method": "POST", ":path": "/v1/messages", "content-type": "application/json", "x-api-key": KEY}
GEMINI = {":method": "POST", ":path": "/v1beta/models/demo-gpt:generateContent", "content-type": "application/json",
          "x-goog-api-key": KEY}
OPENAI_BODY = orjson.dumps({"model": "demo-gpt", "messages": [{"role": "user", "content": "hi"}]})
ANTHROPIC_BODY = orjson.dumps({"model": "demo-gpt", "max_tokens": 16, "messages": [{"role": "user", "content": "hi"}]})
GEMINI_BODY = orjson.dumps({"contents": [{"role": "user", "parts": [{"text": "hi"}]}]})
# demo-gpt at $1 a token either way: a call reporting 1 + 1 tokens costs $2
PRICE = {"input_per_1k": 1000.0, "output_per_1k": 1000.0}


class Stack:
    def __init__(self, tmp: Path, tenant_budget: dict[str, Any] | None):
        data = without_watermarks(yaml.safe_load((ROOT / "modelyard.yaml").read_text()))
        data["ratelimit"]["enabled"] = False
        for m in data["models"]:
            if m["name"] == "demo-gpt":
                m["cost"] = PRICE
                for d in m["deployments"]:
                    d.pop("cost", None)
        if tenant_budget is not None:
            data["tenants"][0]["budget"] = tenant_budget
        self.cfg = parse_config(data)
        self.db = tmp / "keys.db"
        self.metering_db = tmp / "metering.sqlite"
        self.guard = BudgetGuard(SpendStore(self.db), clock=lambda: NOW, interval_s=0.02,
                                 tenant_budgets={t.name: t.budget for t in self.cfg.tenants if t.budget})
        self.metering = MeteringStore(self.metering_db)
        self.gw = Gateway.build(self.cfg, metering=self.metering, budgets=self.guard)

    def close(self) -> None:
        self.guard.close()
        self.metering.close()


@pytest.fixture
def make(tmp_path: Path) -> Iterator[Any]:
    made: list[Stack] = []

    def build(tenant_budget: dict[str, Any] | None = None) -> Stack:
        made.append(Stack(tmp_path, tenant_budget))
        return made[-1]

    yield build
    for s in made:
        s.close()


def _wait(cond: Any, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.01)


async def _request(gw: Gateway, headers: dict[str, str], body: bytes, caller: Caller | None = None) -> Any:
    s = Session(gw, ROUTES)
    await s.handle(headers_msg(headers))
    if caller is not None:  # what the key store's auth step sets for a stored key
        assert s.ctx is not None
        s.ctx.caller = caller
    r = await s.handle(body_msg(body))
    return s, r


async def _answered(gw: Gateway, caller: Caller | None = None) -> None:
    """An OpenAI call answered with 1 + 1 tokens of usage, so the accountant meters $2."""
    s, r = await _request(gw, chat_headers(), OPENAI_BODY, caller)
    assert r.WhichOneof("response") == "request_body", r
    await s.handle(headers_msg({":status": "200", "content-type": "application/json"}, response=True))
    await s.handle(body_msg(orjson.dumps({
        "id": "x", "object": "chat.completion", "created": 1, "model": "demo-gpt",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "yo"}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}}), response=True))
    s.close()


def _headers(r: Any) -> dict[str, str]:
    return {h.header.key: h.header.raw_value.decode() for h in r.immediate_response.headers.set_headers}


async def test_a_spent_tenant_budget_refuses_in_each_callers_protocol(make: Any) -> None:
    st = make({"usd": 5, "period": "day"})
    SpendStore(st.db).add([("tenant", "demo", TODAY, 5.0)])  # another worker spent it
    _wait(lambda: st.guard.ledger.spent("tenant", "demo", st.guard._standing(
        "tenant", "demo", "demo", st.cfg.tenants[0].budget, NOW).window) == 5.0)

    s, r = await _request(st.gw, chat_headers(), OPENAI_BODY)
    assert r.immediate_response.status.code == 429
    assert orjson.loads(r.immediate_response.body) == {"error": {
        "message": "budget exhausted: tenant 'demo' spent $5 of its $5 budget per day, which resets at "
                   "2026-12-04T00:00:00Z", "type": "insufficient_quota", "param": None, "code": "insufficient_quota"}}
    h = _headers(r)
    assert h["retry-after"] == str(6 * 3600)
    task_id = h["x-modelyard-task-id"]
    s.close()

    _, r = await _request(st.gw, ANTHROPIC, ANTHROPIC_BODY)
    body = orjson.loads(r.immediate_response.body)
    assert r.immediate_response.status.code == 429 and body["type"] == "error"
    assert body["error"]["type"] == "rate_limit_error" and "budget exhausted" in body["error"]["message"]
    assert _headers(r)["retry-after"] == str(6 * 3600)
    _, r = await _request(st.gw, GEMINI, GEMINI_BODY)
    assert r.immediate_response.status.code == 429
    assert orjson.loads(r.immediate_response.body)["error"]["status"] == "RESOURCE_EXHAUSTED"

    # Another tenant has no budget: served.
    _, r = await _request(st.gw, chat_headers("sk-modelyard-demo-l2"), OPENAI_BODY)
    assert r.WhichOneof("response") == "request_body"
    st.metering.close()
    with sqlite3.connect(st.metering_db) as conn:
        rows = conn.execute("SELECT task_id, tenant, allowed, requests, limited_by, rule, store, key_id "
                            "FROM decisions").fetchall()
    assert (task_id, "demo", 0, 1, "budget:tenant:demo", "5 usd per day", "budget", None) in rows
    assert len(rows) == 3  # one refusal row per refused call; no rate limiter, so none for the served one


async def test_a_keys_own_budget_counts_its_calls_and_refuses_until_next_monday(make: Any) -> None:
    st = make({"usd": 100, "period": "month"})
    key = Caller(tenant="demo", key_id="key_1", budget=Budget(usd=3, period="week"))
    await _answered(st.gw, key)  # $2 of 3
    await _answered(st.gw, key)  # $4: over (the call was admitted at $2; its whole cost counts)
    assert st.guard.ledger.spent("key", "key_1", st.guard._standing("key", "key_1", "demo", key.budget,
                                                                     NOW).window) == 4.0
    _, r = await _request(st.gw, chat_headers(), OPENAI_BODY, key)
    assert r.immediate_response.status.code == 429
    assert orjson.loads(r.immediate_response.body)["error"]["code"] == "insufficient_quota"
    assert _headers(r)["retry-after"] == str(3 * 86_400 + 6 * 3600)  # Monday 2026-12-07 00:00 UTC
    # The tenant's month budget and another key of the tenant are untouched.
    other = Caller(tenant="demo", key_id="key_2", budget=Budget(usd=3, period="week"))
    _, r = await _request(st.gw, chat_headers(), OPENAI_BODY, other)
    assert r.WhichOneof("response") == "request_body"
    st.close()
    with sqlite3.connect(st.metering_db) as conn:
        metered = conn.execute("SELECT key_id, cost FROM requests").fetchall()
        refused = conn.execute("SELECT key_id, limited_by FROM decisions WHERE store = 'budget'").fetchall()
    assert metered == [("key_1", 2.0), ("key_1", 2.0)]
    assert refused == [("key_1", "budget:key:key_1")]
    totals = SpendStore(st.db).days(TODAY)
    assert totals == [("key", "key_1", TODAY, 4.0), ("tenant", "demo", TODAY, 4.0)]  # flushed at close


async def test_the_tenant_refuses_a_key_with_budget_left_when_its_own_is_spent(make: Any) -> None:
    st = make({"usd": 2, "period": "month"})
    key = Caller(tenant="demo", key_id="key_1", budget=Budget(usd=50, period="day"))
    await _answered(st.gw, key)
    _, r = await _request(st.gw, chat_headers(), OPENAI_BODY, key)
    assert r.immediate_response.status.code == 429
    assert "tenant 'demo'" in orjson.loads(r.immediate_response.body)["error"]["message"]
    assert _headers(r)["retry-after"] == str(28 * 86_400 + 6 * 3600)  # 2027-01-01 00:00 UTC


async def test_the_soft_share_is_announced_once_across_processes(make: Any) -> None:
    first = make({"usd": 10, "period": "day", "soft_share": 0.5})
    second = make({"usd": 10, "period": "day", "soft_share": 0.5})  # another worker on the same ledger
    before = BUDGET_SOFT_CROSSINGS.labels("tenant")._value.get()
    await _answered(first.gw)  # $2: under the share
    _wait(lambda: BUDGET_USED.labels("tenant", "demo", "day")._value.get() == 0.2)
    await _answered(first.gw)
    await _answered(second.gw)  # $6 between them: past the share
    _wait(lambda: BUDGET_SOFT_CROSSINGS.labels("tenant")._value.get() == before + 1)
    _wait(lambda: BUDGET_USED.labels("tenant", "demo", "day")._value.get() == 0.6)
    await _answered(second.gw)
    _wait(lambda: BUDGET_USED.labels("tenant", "demo", "day")._value.get() == 0.8)
    time.sleep(0.2)  # several more rounds of both
    assert BUDGET_SOFT_CROSSINGS.labels("tenant")._value.get() == before + 1
    with sqlite3.connect(first.db) as conn:
        assert conn.execute("SELECT scope, id, period, first_day FROM budget_alerts").fetchall() == [
            ("tenant", "demo", "day", TODAY)]


def test_the_ledger_is_off_without_budgets_and_a_bad_store_is_a_config_error(tmp_path: Path) -> None:
    from contracts.errors import ConfigError

    data = without_watermarks(yaml.safe_load((ROOT / "modelyard.yaml").read_text()))
    assert BudgetGuard.from_config(parse_config(data)) is None  # no budget, no key store, no webhook
    (tmp_path / "a-file").write_text("")
    data["keys"] = {"store": f"sqlite:///{tmp_path / 'a-file' / 'keys.db'}"}
    with pytest.raises(ConfigError, match="keys.store: cannot open the spend ledger"):
        BudgetGuard.from_config(parse_config(data))
    data["keys"] = {"store": "postgresql://gw@db/modelyard"}
    with pytest.raises(ConfigError, match="keys.store"):
        BudgetGuard.from_config(parse_config(data))


async def test_spend_on_one_worker_refuses_on_another_within_a_round(make: Any) -> None:
    first = make({"usd": 3, "period": "day"})
    second = make({"usd": 3, "period": "day"})  # another worker (or replica) on the same ledger
    await _answered(first.gw)
    await _answered(first.gw)  # $4 on the first worker
    _, r = await _request(first.gw, chat_headers(), OPENAI_BODY)
    assert r.immediate_response.status.code == 429  # its own spend counts at once
    deadline = time.monotonic() + 5
    while True:  # the second sees it once a round has written it and its own round has read it
        _, r = await _request(second.gw, chat_headers(), OPENAI_BODY)
        if r.WhichOneof("response") == "immediate_response":
            break
        assert time.monotonic() < deadline, "the second worker never saw the first one's spend"
        await asyncio.sleep(0.01)
    assert r.immediate_response.status.code == 429
