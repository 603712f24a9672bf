"""A/B readouts and feedback through a real Envoy: the shipped `speed` experiment's calls with the
openai SDK, each scored with `POST /v1/feedback`, then `modelyard route ab` reads the arms out and
its numbers equal the metering rows; another tenant's task, a bad score and no key are refused."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
from pathlib import Path

import httpx
import openai
import pytest

from tests.conftest import DEMO_KEY

pytestmark = pytest.mark.e2e
L2_KEY = "sk-modelyard-demo-l2"
CALLS = 24


def _feedback(url: str, key: str | None, payload: object) -> httpx.Response:
    headers = {"authorization": f"Bearer {key}"} if key else {}
    return httpx.post(f"{url}/v1/feedback", json=payload, headers=headers, timeout=10)


def test_feedback_is_stored_beside_its_call_and_the_readout_equals_the_rows(demo_stack) -> None:
    url = demo_stack.url
    client = openai.OpenAI(base_url=f"{url}/v1", api_key=DEMO_KEY, max_retries=0)
    arms: dict[str, str] = {}
    for i in range(CALLS):
        r = client.chat.completions.with_raw_response.create(
            model="auto", messages=[{"role": "user", "content": f"ab {i}"}],
            extra_headers={"x-modelyard-strategy": "speed"})
        arms[r.headers["x-modelyard-task-id"]] = r.headers["x-modelyard-arm"]
    assert set(arms.values()) == {"A", "B"}, arms  # half the task ids hash to B
    for task_id, arm in arms.items():
        r = _feedback(url, DEMO_KEY, {"task_id": task_id, "score": 1 if arm == "A" else 0, "labels": {"src": "e2e"}})
        assert r.status_code == 201, r.text
        assert r.json()["task_id"] == task_id
    some = next(iter(arms))
    refused = {
        "another tenant's task": _feedback(url, L2_KEY, {"task_id": some, "score": 1}),
        "an unknown task": _feedback(url, DEMO_KEY, {"task_id": "no-such-task", "score": 1}),
        "a score out of range": _feedback(url, DEMO_KEY, {"task_id": some, "score": 7}),
        "a boolean score": _feedback(url, DEMO_KEY, {"task_id": some, "score": True}),
        "no key": _feedback(url, None, {"task_id": some, "score": 1}),
    }
    assert {k: r.status_code for k, r in refused.items()} == {
        "another tenant's task": 404, "an unknown task": 404, "a score out of range": 400, "a boolean score": 400,
        "no key": 401}
    assert all(r.json()["error"]["message"] for r in refused.values())

    db = Path(demo_stack.cfg.extproc.metering_db)
    out = subprocess.run([sys.executable, "-m", "modelyard.cli", "route", "ab", "--json", "--min-calls", "3",
                          "--metering-db", str(db)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    (speed,) = [e for e in json.loads(out.stdout) if e["strategy"] == "speed"]
    by_arm = {a["arm"]: a for a in speed["arms"]}
    with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as conn:
        rows = dict(conn.execute("SELECT arm, COUNT(*) FROM requests WHERE strategy = 'speed' GROUP BY arm"))
        scored = conn.execute("SELECT COUNT(*) FROM feedback WHERE labels = ?", ('{"src":"e2e"}',)).fetchone()[0]
    assert {arm: a["requests"] for arm, a in by_arm.items()} == rows
    assert scored == CALLS
    assert by_arm["A"]["feedback"]["value"] == 1.0 and by_arm["B"]["feedback"]["value"] == 0.0
    assert speed["verdicts"]["feedback"] == "A"
