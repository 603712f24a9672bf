"""Two extproc replicas behind one Envoy on one PostgreSQL key store (started by the test, as the
Redis tests start redis-server): a key created by the CLI or through either replica's admin API
serves on both within 1 s; revoked, both refuse it within 2 s. With workers that never refresh, a
key the CLI creates answers at its first call (the miss path), and a stopped PostgreSQL turns away
only keys no worker knows (503), never the ones they do."""

from __future__ import annotations

import contextlib
import io
import json
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import openai
import pytest

from controlplane.environments import EnvironmentConfig
from keys.secret import digest_of
from modelyard.cli import main as cli_main
from tests.keys.postgres_server import running_database
from tests.stack_config import add_extproc_replica, free_ports_run, small_config, start_stack

pytestmark = pytest.mark.e2e
ADMIN_KEY = "adm-e2e-postgres"


def _requests_total(metrics_address: str) -> float:
    text = httpx.get(f"http://{metrics_address}/metrics", timeout=5).text
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith("modelyard_requests_total{"))


def _until(ok: Callable[[], bool], within: float) -> None:
    start = time.monotonic()
    while not ok():
        assert time.monotonic() - start < within, f"not within {within} s"
        time.sleep(0.05)


def _status(url: str, key: str) -> int:
    r = httpx.post(f"{url}/v1/chat/completions", headers={"authorization": f"Bearer {key}"}, timeout=20,
                   json={"model": "demo-gpt", "messages": [{"role": "user", "content": "hi"}]})
    return r.status_code


def test_replicas_share_one_postgresql_key_store(tmp_path: Path) -> None:
    with running_database("modelyard_keys") as (pg, dsn):
        data = small_config()
        data["extproc"].update(tasks=None, batches=None, audit_db=None)
        data["keys"] = {"store": dsn, "admin_keys": [digest_of(ADMIN_KEY)]}
        stack = start_stack(tmp_path, data, EnvironmentConfig(name="t", admin=None, concurrency=1))
        second, second_metrics = add_extproc_replica(stack, data, tmp_path)
        stack.env = EnvironmentConfig(name="t", admin=None, concurrency=1,
                                      extproc_endpoints=[data["extproc"]["address"], second])
        metrics = [data["extproc"]["metrics_address"], second_metrics]
        config = tmp_path / "modelyard.yaml"
        with stack:
            out = io.StringIO()
            with contextlib.redirect_stdout(out):
                assert cli_main(["keys", "create", "--tenant", "demo", "--json", "--config", str(config)]) == 0
            created = json.loads(out.getvalue())
            # Four answers in a row: both replicas (round robin) know the key.
            _until(lambda: all(_status(stack.url, created["key"]) == 200 for _ in range(4)), 1.0)
            before = [_requests_total(m) for m in metrics]
            client = openai.OpenAI(base_url=f"{stack.url}/v1", api_key=created["key"], max_retries=0, timeout=20)
            for i in range(8):  # round robin: both replicas answer with the key
                assert client.chat.completions.create(
                    model="demo-gpt", messages=[{"role": "user", "content": f"hi {i}"}]).choices[0].message.content
            after = [_requests_total(m) for m in metrics]
            assert all(a - b >= 2 for a, b in zip(after, before, strict=True)), (before, after)

            # Through the admin API: one replica writes, the other reads it from PostgreSQL.
            r = httpx.post(f"{stack.url}/admin/v1/keys", headers={"authorization": f"Bearer {ADMIN_KEY}"},
                           json={"tenant": "demo-l2", "models": ["demo-gpt"]}, timeout=20)
            assert r.status_code == 201, r.text
            via_api = r.json()
            _until(lambda: all(_status(stack.url, via_api["key"]) == 200 for _ in range(4)), 1.0)

            with contextlib.redirect_stdout(io.StringIO()):
                assert cli_main(["keys", "revoke", created["id"], "--config", str(config)]) == 0
            _until(lambda: all(_status(stack.url, created["key"]) == 401 for _ in range(4)), 2.0)
            r = httpx.post(f"{stack.url}/admin/v1/keys/{via_api['id']}/revoke",
                           headers={"authorization": f"Bearer {ADMIN_KEY}"}, timeout=20)
            assert r.status_code == 200 and r.json()["status"] == "revoked"
            _until(lambda: all(_status(stack.url, via_api["key"]) == 401 for _ in range(4)), 2.0)
            assert _status(stack.url, "sk-modelyard-demo") == 200  # config-file keys are untouched
            # A key's budget is one across replicas: both write its spend to PostgreSQL's ledger.
            out = io.StringIO()
            with contextlib.redirect_stdout(out):
                assert cli_main(["keys", "create", "--tenant", "demo", "--budget-usd", "0.1", "--budget-period",
                                 "day", "--json", "--config", str(config)]) == 0
            budgeted = json.loads(out.getvalue())
            _until(lambda: _status(stack.url, budgeted["key"]) == 200, 1.0)
            codes = [200]
            while codes[-1] == 200 and len(codes) < 12:  # about $0.045 a call: spent within three
                time.sleep(0.6)  # a ledger round on each replica
                codes.append(_status(stack.url, budgeted["key"]))
            assert codes[-1] == 429, codes
            assert [_status(stack.url, budgeted["key"]) for _ in range(4)] == [429] * 4  # both replicas
            import psycopg

            with psycopg.connect(dsn) as conn:
                usd = conn.execute("SELECT SUM(usd) FROM budget_spend WHERE scope = 'key' AND id = %s",
                                   (budgeted["id"],)).fetchone()[0]
            assert usd >= 0.1


def _create(config: Path) -> dict[str, str]:
    """`modelyard keys create` as a script runs it: its own process, returning once the row is committed."""
    done = subprocess.run([sys.executable, "-m", "modelyard.cli", "keys", "create", "--tenant", "demo", "--json",
                           "--config", str(config)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_a_new_key_answers_at_once_and_a_store_outage_spares_known_keys(tmp_path: Path) -> None:
    with running_database("modelyard_keys_miss") as (pg, dsn):
        data = small_config()
        grpc_port, metrics_port = free_ports_run(2), free_ports_run(2)
        data["extproc"].update(address=f"127.0.0.1:{grpc_port}", metrics_address=f"127.0.0.1:{metrics_port}",
                               workers=2, tasks=None, batches=None, audit_db=None)
        data["keys"] = {"store": dsn, "refresh_s": 3600}  # read at start only: later keys come by lookup
        with start_stack(tmp_path, data) as stack:
            created = _create(tmp_path / "modelyard.yaml")
            client = openai.OpenAI(base_url=f"{stack.url}/v1", api_key=created["key"], max_retries=0, timeout=20)
            for i in range(4):  # at once, on both workers (round robin)
                assert client.chat.completions.create(
                    model="demo-gpt", messages=[{"role": "user", "content": f"hi {i}"}]).choices[0].message.content

            pg.stop()
            assert [_status(stack.url, created["key"]) for _ in range(4)] == [200] * 4  # known keys serve on
            assert _status(stack.url, "sk-modelyard-demo") == 200
            unknown = openai.OpenAI(base_url=f"{stack.url}/v1", api_key="my-not-known-here", max_retries=0,
                                    timeout=20)
            for _ in range(2):  # each worker: a clear 503 with retry-after, not a 401 for a key nobody checked
                with pytest.raises(openai.InternalServerError) as e:
                    unknown.chat.completions.create(model="demo-gpt", messages=[{"role": "user", "content": "hi"}])
                assert e.value.status_code == 503 and e.value.response.headers["retry-after"] == "1"

            pg.start()
            # Both workers ask the store again once its pause is over: the unknown key is a 401 again.
            _until(lambda: all(_status(stack.url, "my-not-known-here-2") == 401 for _ in range(4)), 10.0)
            again = _create(tmp_path / "modelyard.yaml")
            assert [_status(stack.url, again["key"]) for _ in range(4)] == [200] * 4
