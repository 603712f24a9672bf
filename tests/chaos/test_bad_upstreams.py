"""6. An upstream slower than its deployment's timeout, and one that answers garbage: the caller
gets its own protocol's 504/502, nothing of the upstream's detail, and the next request is fine."""

from __future__ import annotations

import httpx
import pytest

from devstack.demo.faults import GARBAGE, SLOW
from tests.chaos.figures import record
from tests.chaos.observe import metered_rows
from tests.chaos.stacks import TIMEOUT_MS, TWIN, A, B
from tests.chaos.traffic import PINNED
from tests.conftest import DEMO_KEY

pytestmark = [pytest.mark.chaos, pytest.mark.e2e]
LEAKS = ("upstream.internal", "stack trace", "<html>", "127.0.0.1", "demo-chaos")


def _openai(url: str, text: str) -> httpx.Response:
    return httpx.post(f"{url}/v1/chat/completions", timeout=30, headers={"authorization": f"Bearer {DEMO_KEY}", **PINNED},
                      json={"model": TWIN, "messages": [{"role": "user", "content": text}]})


def _anthropic(url: str, text: str) -> httpx.Response:
    return httpx.post(f"{url}/v1/messages", timeout=30, headers={"x-api-key": DEMO_KEY, **PINNED},
                      json={"model": TWIN, "max_tokens": 50, "messages": [{"role": "user", "content": text}]})


def _error_message(protocol: str, r: httpx.Response) -> str:
    body = r.json()
    if protocol == "anthropic":
        assert body["type"] == "error" and body["error"]["type"]
    else:
        assert body["error"]["type"]
    return body["error"]["message"]


@pytest.mark.parametrize("fault,status", [(SLOW, 504), (GARBAGE, 502)])
@pytest.mark.parametrize("protocol", ["openai", "anthropic"])
def test_bad_upstream_answers_in_the_callers_shape(twins, fault: str, status: int, protocol: str) -> None:
    stack = twins  # four faults at most: whatever A learns, B is there for the next request
    send = _anthropic if protocol == "anthropic" else _openai
    r = send(stack.url, f"please {fault} now")
    assert r.status_code == status, r.text
    message = _error_message(protocol, r)
    assert not any(leak in r.text for leak in LEAKS), r.text
    if fault == SLOW:
        assert r.elapsed.total_seconds() < TIMEOUT_MS / 1000 + 5  # the deployment's timeout, not the route's
    after = send(stack.url, "and now a normal question")
    assert after.status_code == 200, after.text
    assert after.headers["x-modelyard-cluster"] in (A, B)  # a timed-out deployment may be scored down
    rows = metered_rows(stack.cfg.extproc.metering_db, {r.headers["x-modelyard-task-id"]})
    assert list(rows.values()) == [status]
    record(f"{fault} upstream ({protocol} caller)", f"upstream {'slower than its timeout' if fault == SLOW else 'answers garbage'}",
           ok_rps="n/a", lost=0, recovery_s=0.0, detail=f"caller got {status} ({message[:60]}); next request 200")
