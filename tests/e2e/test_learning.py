"""Routing that learns, through a real Envoy with the openai and anthropic SDKs: the shipped
`demo-learn` model's bandit moves its traffic off a failing demo server and back when the other
one turns slow; a group breaker over a model trips on its failures, fails fast in the caller's
protocol with a retry-after, and heals through a half-open probe; a share breaker moves a group's
calls off the model the cost strategy piles them onto, and back when its share has fallen; under
`output_limit: clamp` a translated call's output cap is lowered to the model's limit. One stack for
the module."""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path

import anthropic
import httpx
import openai
import orjson
import pytest
import yaml

from tests.conftest import DEMO_KEY
from tests.stack_config import ROOT, free_port, small_config, start_stack

pytestmark = pytest.mark.e2e
HALF_LIFE_S = 3.0
OPEN_S = 2.0
PILE_MIN = 5


def _config() -> dict:
    shipped = yaml.safe_load((ROOT / "modelyard.yaml").read_text())
    learn = next(m for m in shipped["models"] if m["name"] == "demo-learn")
    assert [d["cluster"] for d in learn["deployments"]] == ["demo-learn-a", "demo-learn-b"]
    assert "demo-learn" in shipped["routing"]["adaptive"]["models"]
    for d in learn["deployments"]:
        d["endpoints"] = [f"127.0.0.1:{free_port()}"]
    data = small_config()
    # demo-trip leads its group (the best quality, fast, free); demo-gpt (small_config's) is the group's other model
    data["models"][0]["groups"] = ["trip-group", "pile-group"]
    trip = {"name": "demo-trip", "quality": 1.0, "latency_ms": 50, "groups": ["trip-group"],
            "deployments": [{"cluster": "demo-trip-a", "protocol": "openai", "endpoints": [f"127.0.0.1:{free_port()}"]}]}
    # demo-cheap costs next to nothing: the cost strategy sends pile-group's every call there
    cheap = {"name": "demo-cheap", "quality": 0.5, "groups": ["pile-group"], "cost": {"input_per_1k": 0.01},
             "deployments": [{"cluster": "demo-cheap-a", "protocol": "openai",
                              "endpoints": [f"127.0.0.1:{free_port()}"]}]}
    data["models"] += [learn, trip, cheap]
    data["routing"] = {
        # the shipped reward, on a shorter memory so the test sees it forget within seconds
        "adaptive": {**shipped["routing"]["adaptive"], "half_life_s": HALF_LIFE_S, "latency_target_ms": 50,
                     "refresh_s": 0},
        "breakers": [{"model": "demo-trip", "window_s": 10, "min_calls": 3, "error_rate": 0.5, "open_s": OPEN_S,
                      "probes": 1}],
        # cooldowns judge one deployment: kept out of the way so what moves traffic here is the bandit
        "share_breakers": [{"group": "pile-group", "window_s": 60, "min_calls": PILE_MIN, "max_share": 0.6,
                            "open_s": OPEN_S}],
        # demo-gpt (max_output_tokens 2048) is the only model of its name: a larger cap is clamped
        "output_limit": "clamp",
        "cooldown": {"failures": 1000}}
    data["extproc"]["audit_db"] = "audit.sqlite"
    return data


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory):
    data = _config()
    with start_stack(tmp_path_factory.mktemp("learning"), data, shared_demos=True) as s:
        yield s


def _demo(stack, cluster: str) -> str:
    return f"http://{stack.cfg.clusters()[cluster].endpoints[0]}"


def _calls(client: openai.OpenAI, n: int) -> list[tuple[str, str]]:
    """n calls of demo-learn: (arm the bandit chose, cluster that answered) each; all must be 200."""
    out = []
    for i in range(n):
        r = client.chat.completions.with_raw_response.create(
            model="demo-learn", messages=[{"role": "user", "content": f"learn {i}"}])
        assert r.http_response.status_code == 200
        assert r.headers["x-modelyard-strategy"] == "adaptive"
        out.append((r.headers["x-modelyard-arm"], r.headers["x-modelyard-cluster"]))
    return out


def _share(calls: list[tuple[str, str]], arm: str) -> float:
    return sum(a == arm for a, _ in calls) / len(calls)


def test_the_bandit_moves_off_a_failing_deployment_and_back(stack) -> None:
    client = openai.OpenAI(base_url=f"{stack.url}/v1", api_key=DEMO_KEY, max_retries=0)
    a, b = "demo-learn-a", "demo-learn-b"
    httpx.post(f"{_demo(stack, a)}/fake-queue", json={"fail_rate": 1.0}, timeout=5).raise_for_status()
    first = _calls(client, 40)
    # a's calls fail over inside Envoy to b (the caller sees 200); the bandit learns a failed
    assert all(cluster == b for _, cluster in first)
    # Counted over 20 calls with room for the sampling: the floor (5%) and Thompson's draws make each pick
    # random, and a bound of 12 of 15 failed one run in twenty at the share the bandit reaches here.
    assert _share(first[-20:], b) >= 0.7, first
    # a heals and b turns slow: within 60 calls the traffic is back on a
    httpx.post(f"{_demo(stack, a)}/fake-queue", json={"fail_rate": 0.0}, timeout=5).raise_for_status()
    # 1 s slower: a gap a loaded box cannot close (a's own latency enters the reward too)
    httpx.post(f"{_demo(stack, b)}/fake-queue", json={"delay_ms": 1000}, timeout=5).raise_for_status()
    second = _calls(client, 60)
    assert _share(second[-20:], a) >= 0.7, second
    httpx.post(f"{_demo(stack, b)}/fake-queue", json={"delay_ms": 0}, timeout=5).raise_for_status()

    # every call's metering row carries the arm and the probability it had; the audit row says the same
    db = Path(stack.cfg.extproc.metering_db)
    deadline = time.monotonic() + 10
    while True:
        with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as conn:
            rows = conn.execute("SELECT task_id, arm, cluster, propensity FROM requests WHERE strategy = 'adaptive'"
                                ).fetchall()
        if len(rows) >= 100 or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert len(rows) == 100
    assert all(arm in (a, b) and 0.05 <= p <= 1.0 for _, arm, _, p in rows)
    assert any(p < 0.5 for *_, p in rows) and any(p > 0.5 for *_, p in rows)
    task, arm, _, p = rows[-1]
    deadline = time.monotonic() + 10
    while True:
        with sqlite3.connect(stack.cfg.extproc.audit_db) as conn:
            found = conn.execute("SELECT detail FROM audit WHERE task_id = ?", (task,)).fetchone()
        if found is not None or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert found is not None
    detail = orjson.loads(found[0])
    assert (detail["strategy"], detail["arm"], detail["propensity"]) == ("adaptive", arm, pytest.approx(p, abs=1e-6))
    metrics = httpx.get(f"http://{stack.cfg.extproc.metrics_address}/metrics", timeout=5).text
    assert f'modelyard_bandit_arm{{channel="standard",cluster="{a}",field="share",model="demo-learn",tenant=""}}' \
        in metrics
    assert f'modelyard_bandit_picks_total{{channel="standard",cluster="{b}",model="demo-learn"}}' in metrics


def test_a_group_breaker_fails_fast_in_the_callers_protocol_and_heals(stack) -> None:
    oa = openai.OpenAI(base_url=f"{stack.url}/v1", api_key=DEMO_KEY, max_retries=0)
    ac = anthropic.Anthropic(base_url=stack.url, api_key=DEMO_KEY, max_retries=0)
    statuses = []
    while 503 not in statuses and len(statuses) < 4:  # the model's upstream fails; the breaker counts the attempts
        with pytest.raises(openai.APIStatusError) as e:
            oa.chat.completions.create(model="demo-trip", messages=[{"role": "user", "content": "demo-fail-500"}])
        statuses.append(e.value.status_code)
    tripped_at = time.monotonic()
    # 502s (an upstream failure, each one or two attempts: Envoy retries a 5xx once) until 3 outcomes trip it
    assert statuses[0] == 502 and statuses[-1] == 503 and set(statuses[:-1]) == {502}, statuses
    with pytest.raises(openai.APIStatusError) as e:
        oa.chat.completions.with_raw_response.create(model="demo-trip", messages=[{"role": "user", "content": "hi"}])
    assert e.value.status_code == 503 and "group breaker model:demo-trip open" in e.value.message
    assert 1 <= int(e.value.response.headers["retry-after"]) <= 2
    with pytest.raises(anthropic.APIStatusError) as m:
        ac.messages.create(model="demo-trip", max_tokens=16, messages=[{"role": "user", "content": "hi"}])
    assert m.value.status_code == 503 and m.value.body["type"] == "error"  # Anthropic's own error shape
    # the group spills past the open breaker to its other model; the audit row says what it routed around
    spilled = oa.chat.completions.with_raw_response.create(
        model="trip-group", messages=[{"role": "user", "content": "hi"}], extra_headers={"x-modelyard-strategy": "quality"})
    assert spilled.http_response.status_code == 200 and spilled.headers["x-modelyard-model"] == "demo-gpt"
    spilled_task = spilled.headers["x-modelyard-task-id"]
    metrics = httpx.get(f"http://{stack.cfg.extproc.metrics_address}/metrics", timeout=5).text
    assert 'modelyard_breaker_trips_total{group="model:demo-trip",reason="error_rate"} 1.0' in metrics
    assert 'modelyard_breaker_state{group="model:demo-trip"} 1.0' in metrics
    # past open_s one probe goes through; its answer closes the breaker
    time.sleep(max(OPEN_S - (time.monotonic() - tripped_at), 0) + 0.2)
    for i in range(3):
        r = oa.chat.completions.with_raw_response.create(model="demo-trip", messages=[{"role": "user", "content": f"ok {i}"}])
        assert r.http_response.status_code == 200
    metrics = httpx.get(f"http://{stack.cfg.extproc.metrics_address}/metrics", timeout=5).text
    assert 'modelyard_breaker_state{group="model:demo-trip"} 0.0' in metrics
    # the refusals' audit rows name the breaker
    deadline = time.monotonic() + 10
    while True:
        with sqlite3.connect(stack.cfg.extproc.audit_db) as conn:
            refused = [orjson.loads(d) for (d,) in conn.execute(
                "SELECT detail FROM audit WHERE model = 'demo-trip' AND status = 503")]
        if len(refused) >= 3 or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert len(refused) == 3 and all(d["reason"] == "group breaker open" for d in refused)
    row = None
    while row is None and time.monotonic() < deadline:
        with sqlite3.connect(stack.cfg.extproc.audit_db) as conn:
            row = conn.execute("SELECT detail FROM audit WHERE task_id = ?", (spilled_task,)).fetchone()
        time.sleep(0.1)
    assert row is not None
    around = orjson.loads(row[0])["routed_around"]
    assert len(around) == 1 and around[0].startswith("group breaker model:demo-trip open ("), around


def _audit_detail(stack, task: str) -> dict:
    deadline = time.monotonic() + 10
    row = None
    while row is None and time.monotonic() < deadline:
        with sqlite3.connect(stack.cfg.extproc.audit_db) as conn:
            row = conn.execute("SELECT detail FROM audit WHERE task_id = ?", (task,)).fetchone()
        time.sleep(0.1)
    assert row is not None
    return orjson.loads(row[0])


def test_a_share_breaker_moves_calls_off_the_cheap_model_and_back(stack) -> None:
    oa = openai.OpenAI(base_url=f"{stack.url}/v1", api_key=DEMO_KEY, max_retries=0)

    def ask(i: int) -> tuple[str, str]:
        r = oa.chat.completions.with_raw_response.create(
            model="pile-group", messages=[{"role": "user", "content": f"pile {i}"}],
            extra_headers={"x-modelyard-strategy": "cost"})
        assert r.http_response.status_code == 200
        return r.headers["x-modelyard-model"], r.headers["x-modelyard-task-id"]

    # the cheap model takes every call until it holds them all with min_calls counted: that call trips it
    assert [ask(i)[0] for i in range(PILE_MIN)] == ["demo-cheap"] * PILE_MIN
    tripped_at = time.monotonic()
    # the group's next calls go to demo-gpt until demo-cheap's share (5 of 5, 6, 7, 8) is back to 60%
    moved = [ask(PILE_MIN + i) for i in range(4)]
    assert [m for m, _ in moved] == ["demo-gpt"] * 4
    metrics = httpx.get(f"http://{stack.cfg.extproc.metrics_address}/metrics", timeout=5).text
    assert 'modelyard_breaker_trips_total{group="share:pile-group:demo-cheap",reason="share"} 1.0' in metrics
    assert 'modelyard_breaker_trips_total{group="share:pile-group:demo-gpt",reason="share"} 0.0' in metrics
    assert 'modelyard_breaker_state{group="share:pile-group:demo-cheap"} 1.0' in metrics
    around = _audit_detail(stack, moved[0][1])["routed_around"]
    assert around == ["share breaker pile-group: demo-cheap took 100% of 5 calls in 60s (max 60%; "
                      + around[0].rsplit("; ", 1)[1]], around
    # past open_s, with its share at 5 of 9, the cheap model is back
    time.sleep(max(OPEN_S - (time.monotonic() - tripped_at), 0) + 0.2)
    assert ask(99)[0] == "demo-cheap"
    metrics = httpx.get(f"http://{stack.cfg.extproc.metrics_address}/metrics", timeout=5).text
    assert 'modelyard_breaker_state{group="share:pile-group:demo-cheap"} 0.0' in metrics


def test_output_limit_clamp_lowers_a_translated_calls_cap_to_the_models_limit(stack) -> None:
    gpt = stack.cfg.model("demo-gpt")
    assert gpt is not None
    limit = gpt.capabilities.max_output_tokens
    ac = anthropic.Anthropic(base_url=stack.url, api_key=DEMO_KEY, max_retries=0)
    # Anthropic in, OpenAI upstream: the rendered request carries the model's limit, and the reply says so
    r = ac.messages.with_raw_response.create(model="demo-gpt", max_tokens=limit + 3000,
                                             messages=[{"role": "user", "content": "demo-show-max-tokens"}])
    assert r.http_response.status_code == 200
    assert r.headers["x-modelyard-output-clamped"] == f"{limit + 3000}->{limit}"
    assert r.parse().content[0].text.endswith(f"max_tokens={limit}")
    # a cap within the limit goes as asked
    r = ac.messages.with_raw_response.create(model="demo-gpt", max_tokens=100,
                                             messages=[{"role": "user", "content": "demo-show-max-tokens"}])
    assert "x-modelyard-output-clamped" not in r.headers and r.parse().content[0].text.endswith("max_tokens=100")
    # OpenAI in, OpenAI upstream: the client's own bytes pass through with the cap field lowered
    oc = openai.OpenAI(base_url=f"{stack.url}/v1", api_key=DEMO_KEY, max_retries=0)
    r2 = oc.chat.completions.with_raw_response.create(model="demo-gpt", max_tokens=limit + 3000,
                                                      messages=[{"role": "user", "content": "demo-show-max-tokens"}])
    assert r2.headers["x-modelyard-output-clamped"] == f"{limit + 3000}->{limit}"
    assert (r2.parse().choices[0].message.content or "").endswith(f"max_tokens={limit}")
