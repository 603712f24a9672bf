"""7b. The PostgreSQL key store stopped and started again under a running gateway: keys are served
from the cached copy, a budget still refuses once spent (local spend counts while the ledger
cannot be written), an admin write is refused with 503 + retry-after (never a 500 or a hang);
once PostgreSQL is back, writes succeed on the first try and the spend reaches the ledger,
without restarting anything."""

from __future__ import annotations

import time
from pathlib import Path

import httpx
import openai
import pytest

from keys.secret import digest_of
from tests.chaos.figures import record
from tests.keys.postgres_server import running_database
from tests.stack_config import small_config, start_stack

pytestmark = [pytest.mark.chaos, pytest.mark.e2e]
ADMIN = "adm-chaos-postgres"
MAX_CALLS = 12  # a $0.1 budget at about $0.045 a call is spent well before this


def _admin_create(url: str, **spec: object) -> httpx.Response:
    return httpx.post(f"{url}/admin/v1/keys", headers={"authorization": f"Bearer {ADMIN}"}, timeout=20,
                      json={"tenant": "demo", "models": ["demo-gpt"], **spec})


def _chat(url: str, key: str) -> int:
    client = openai.OpenAI(base_url=f"{url}/v1", api_key=key, max_retries=0, timeout=20)
    try:
        client.chat.completions.create(model="demo-gpt", messages=[{"role": "user", "content": "hi"}])
        return 200
    except openai.APIStatusError as e:
        return e.status_code


def _ledger_usd(dsn: str, key_id: str) -> float:
    import psycopg

    with psycopg.connect(dsn, connect_timeout=5) as conn:
        row = conn.execute("SELECT COALESCE(SUM(usd), 0) FROM budget_spend WHERE scope = 'key' AND id = %s",
                           (key_id,)).fetchone()
    return float(row[0]) if row else 0.0


def test_postgres_outage_serves_cached_keys_holds_budgets_and_refuses_writes_with_503(tmp_path: Path) -> None:
    with running_database("modelyard_keys") as (pg, dsn):
        data = small_config()
        data["extproc"].update(tasks=None, batches=None, audit_db=None)
        data["keys"] = {"store": dsn, "admin_keys": [digest_of(ADMIN)], "refresh_s": 0.5}
        with start_stack(tmp_path, data) as stack:
            plain = _admin_create(stack.url)
            budgeted = _admin_create(stack.url, budget_usd=0.1, budget_period="day")
            assert plain.status_code == 201 and budgeted.status_code == 201, (plain.text, budgeted.text)
            assert _chat(stack.url, plain.json()["key"]) == 200

            pg.stop()
            t_down = time.monotonic()
            served = [_chat(stack.url, plain.json()["key"]) for _ in range(5)]
            spent = [_chat(stack.url, budgeted.json()["key"])]
            while spent[-1] == 200 and len(spent) < MAX_CALLS:
                spent.append(_chat(stack.url, budgeted.json()["key"]))
            write = _admin_create(stack.url)
            down_s = time.monotonic() - t_down

            pg.start()
            t_up = time.monotonic()
            again = _admin_create(stack.url)  # the first write after the restart
            recovery = time.monotonic() - t_up
            new_key_ok = _chat(stack.url, again.json()["key"]) if again.status_code == 201 else -1
            deadline = time.monotonic() + 30  # a bound on waiting for the sync thread's next round
            while _ledger_usd(dsn, budgeted.json()["id"]) < 0.1 and time.monotonic() < deadline:
                time.sleep(0.2)
            usd = _ledger_usd(dsn, budgeted.json()["id"])
            still_refused = _chat(stack.url, budgeted.json()["key"])
            log_path = next(c for c in stack.children if c.name == "extproc").log_path(stack.log_dir)
            while "key store reachable again" not in log_path.read_text() and time.monotonic() < deadline:
                time.sleep(0.2)  # the refresher's next period after the restart
            log = log_path.read_text()
    record("PostgreSQL outage (keys, budgets)", "postgres stopped: 5 calls on a cached key, a budgeted key "
           "spent, an admin write; started again", ok_rps="n/a", lost=sum(1 for s in served if s != 200),
           recovery_s=round(recovery, 2),
           detail=f"cached key {served.count(200)}/5 200; budget refused after {len(spent) - 1} calls; "
                  f"admin write {write.status_code} + retry-after {write.headers.get('retry-after')} "
                  f"in {down_s:.1f} s; ${usd:.3f} of spend in the ledger after")
    assert served == [200] * 5  # keys from the cached copy
    assert spent[-1] == 429 and set(spent[:-1]) == {200}, spent  # the budget holds on local spend
    assert write.status_code == 503 and write.headers.get("retry-after"), write.text
    assert "key store cannot be reached" in write.json()["error"]["message"]
    assert again.status_code == 201 and new_key_ok == 200, again.text
    assert usd >= 0.1 and still_refused == 429  # the outage's spend reached the ledger
    assert "key store refresh failed, serving the last keys read" in log
    assert "key store reachable again" in log
