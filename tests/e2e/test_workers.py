"""`extproc.workers: 2`: two extproc processes behind one Envoy, through a real stack and the
OpenAI SDK; streams spread over both, metering from both lands in the one SQLite file, and no
worker outlives `modelyard serve`."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import httpx
import openai

from tests.conftest import DEMO_KEY
from tests.stack_config import free_ports_run, small_config, start_stack

REQUESTS = 40


def _children(pid: int) -> list[int]:
    out = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            out.append(int(stat.parent.name))
    return out


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _requests_total(metrics_address: str) -> float:
    text = httpx.get(f"http://{metrics_address}/metrics", timeout=5).text
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith("modelyard_requests_total{"))


def test_two_workers_share_streams_and_state_and_stop_with_serve(tmp_path: Path) -> None:
    data = small_config()
    grpc_port, metrics_port = free_ports_run(2), free_ports_run(2)
    data["extproc"].update(address=f"127.0.0.1:{grpc_port}", metrics_address=f"127.0.0.1:{metrics_port}",
                           workers=2, metering_db="metering.sqlite", audit_db=None, tasks=None, batches=None)
    with start_stack(tmp_path, data) as stack:
        client = openai.OpenAI(base_url=f"{stack.url}/v1", api_key=DEMO_KEY, max_retries=0)
        for i in range(REQUESTS):
            reply = client.chat.completions.create(model="demo-gpt",
                                                   messages=[{"role": "user", "content": f"hello {i}"}])
            assert reply.choices[0].message.content
        per_worker = [_requests_total(f"127.0.0.1:{metrics_port + i}") for i in range(2)]
        workers = _children(stack.child("extproc").proc.pid)
        assert len(workers) == 1  # worker 0 is `serve` itself
    # Envoy balances streams round robin across the two endpoints.
    assert sum(per_worker) == REQUESTS and min(per_worker) >= REQUESTS // 4, per_worker
    assert not any(_alive(pid) for pid in workers)
    with sqlite3.connect(tmp_path / "metering.sqlite") as db:
        assert db.execute("SELECT count(*) FROM requests").fetchone()[0] == REQUESTS
