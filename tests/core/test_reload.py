"""The extproc's atomic reload (extproc/live/reload.py), driven in memory: a session keeps the snapshot it started
with, bucket levels and queues survive, a removed deployment's waiter gets an error (never a hang), a
config that fails leaves everything as it was, and the control-plane long-poll applies and acks."""

from __future__ import annotations

import asyncio
import copy
from typing import Any

import orjson
import pytest
import yaml

from contracts.config import hash_api_key, parse_config
from contracts.errors import Unavailable, UnknownModel
from contracts.live_config import config_version
from extproc.admission.concurrency import ConcurrencyLimits
from extproc.gateway import Gateway, LiveGateway
from extproc.live.config_feed import ConfigFeed
from extproc.live.reload import Reloader
from extproc.session import Session
from extproc.telemetry.warmup import Warmer
from ratelimit import Limiter
from ratelimit import RequestContext as RateLimitContext
from tests.core.session_driver import ROOT, ROUTES, body_msg, chat_headers, headers_msg, set_headers
from tests.live_control_plane import ControlPlane
from tests.stack_config import without_watermarks

NEW_KEY = "sk-reload-new-tenant"


def _data() -> dict[str, Any]:
    return without_watermarks(yaml.safe_load((ROOT / "modelyard.yaml").read_text()))


def _text(data: dict[str, Any]) -> bytes:
    return yaml.safe_dump(data, sort_keys=False).encode()


def _live(data: dict[str, Any]) -> tuple[LiveGateway, Reloader]:
    config = parse_config(data)
    gw = Gateway.build(config, limiter=Limiter(config.ratelimit), limits=ConcurrencyLimits(config))
    live = LiveGateway(gw, config_version(_text(data)))
    return live, Reloader(live)


def _with_new_tenant(data: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(data)
    out["tenants"].append({"name": "newcomer", "tier": "L2", "api_keys": [hash_api_key(NEW_KEY)],
                           "allowed_models": ["demo-gpt"]})
    return out


async def _route(gw: Gateway, key: str, model: str = "demo-gpt") -> Any:
    """One session run to its body step's reply (a forward upstream or an immediate error)."""
    s = Session(gw, ROUTES)
    first = await s.handle(headers_msg(chat_headers(key)))
    if first.WhichOneof("response") == "immediate_response":
        s.close()
        return first
    r = await s.handle(body_msg(orjson.dumps({"model": model, "messages": [{"role": "user", "content": "hi"}]})))
    s.close()
    return r


async def test_new_tenant_answers_after_reload_and_a_session_started_before_keeps_its_snapshot() -> None:
    data = _data()
    live, reloader = _live(data)
    before = live.current
    assert (await _route(live.current, NEW_KEY)).immediate_response.status.code == 401
    # A stream that started before the reload: past its headers (authenticated on the old snapshot).
    old_stream = Session(live.current, ROUTES)
    await old_stream.handle(headers_msg(chat_headers("sk-modelyard-demo-l2")))

    fresh = _with_new_tenant(data)
    fresh["tenants"] = [t for t in fresh["tenants"] if t["name"] != "demo-l2"]  # and one tenant leaves
    out = await reloader.apply_text(_text(fresh), source="test", origin="memory")
    assert out.ok, out.error
    assert live.current is not before and live.version == config_version(_text(fresh)) == out.version
    assert out.changes["tenants_added"] == ["newcomer"] and out.changes["tenants_removed"] == ["demo-l2"]

    # The old stream finishes on its own snapshot: its tenant still exists there, its request goes upstream.
    r = await old_stream.handle(body_msg(orjson.dumps({"model": "demo-gpt", "messages": [
        {"role": "user", "content": "started before"}]})))
    old_stream.close()
    assert set_headers(r.request_body.response.header_mutation)["x-modelyard-cluster"]
    # New streams see the new snapshot: the new key answers, the removed tenant's key does not.
    r = await _route(live.current, NEW_KEY)
    assert set_headers(r.request_body.response.header_mutation)["x-modelyard-cluster"]
    assert (await _route(live.current, "sk-modelyard-demo-l2")).immediate_response.status.code == 401
    assert (await _route(live.current, NEW_KEY, "demo-claude")).immediate_response.status.code == 404


async def test_bucket_levels_are_kept_and_a_changed_limit_takes_effect() -> None:
    data = _data()
    data["ratelimit"]["limits"] = [{"scope": "tenant", "match": "demo", "unit": "requests", "rate": 0.001,
                                    "burst": 2}]
    live, reloader = _live(data)
    ctx = RateLimitContext("demo", "L1", "demo-openai", "standard")
    limiter = live.current.dispatcher.limiter
    assert limiter is not None
    assert [(await limiter.acquire(ctx)).allowed for _ in range(3)] == [True, True, False]
    # A reload that changes something else: the emptied bucket stays empty (not refilled to its burst).
    assert (await reloader.apply_text(_text(_with_new_tenant(data)), source="test", origin="memory")).ok
    assert live.current.dispatcher.limiter is limiter
    assert not (await limiter.acquire(ctx)).allowed
    # A faster refill from the next reload on: admitted again.
    faster = _with_new_tenant(data)
    faster["ratelimit"]["limits"][0].update(rate=1000, burst=1000)
    assert (await reloader.apply_text(_text(faster), source="test", origin="memory")).ok
    await asyncio.sleep(0.01)
    assert (await limiter.acquire(ctx)).allowed


def _slots(max_inflight: int, *, keep_model: bool = True, keep_deployment: bool = True) -> dict[str, Any]:
    """Model `m` on `c` (max_inflight) and `free`; `m2` on `free`. Options drop `c`, or `m` entirely."""
    dep = {"cluster": "c", "protocol": "openai", "endpoints": ["127.0.0.1:9"], "max_inflight": max_inflight,
           "queue": {"max_wait_s": 30}}
    free = {"cluster": "free", "protocol": "openai", "endpoints": ["127.0.0.1:9"]}
    models = [{"name": "m2", "deployments": [free]}]
    if keep_model:
        models.append({"name": "m", "deployments": [dep, free] if keep_deployment else [free]})
    return {"models": models, "tenants": [{"name": "t", "api_keys": [hash_api_key("k")]}]}


@pytest.mark.parametrize(("keep_model", "error"), [(False, UnknownModel), (True, Unavailable)])
async def test_a_removed_deployments_waiter_gets_an_error_not_a_hang(keep_model: bool, error: type) -> None:
    live, reloader = _live(_slots(1))
    limits = live.current.dispatcher.limits
    held = await limits.acquire("c", "m", "t", "L3")
    assert held is not None
    waiter = asyncio.ensure_future(limits.acquire("c", "m", "t", "L3"))
    await asyncio.sleep(0.01)
    assert not waiter.done() and limits.queues["c"].waiting() == 1

    out = await reloader.apply_text(_text(_slots(1, keep_model=keep_model, keep_deployment=False)), source="test",
                              origin="memory")
    assert out.ok, out.error
    with pytest.raises(error) as e:
        await asyncio.wait_for(waiter, 1)  # at once, not after its 30 s max wait
    assert e.value.status == (404 if not keep_model else 503)
    assert "c" not in limits.queues and "c" not in limits.occupancy
    held.release()  # the call that held a slot on the removed deployment ends normally
    assert not limits._retired


async def test_max_inflight_raised_grants_the_waiters_and_the_queue_is_the_same() -> None:
    live, reloader = _live(_slots(1))
    limits = live.current.dispatcher.limits
    queue = limits.queues["c"]
    held = await limits.acquire("c", "m", "t", "L3")
    waiters = [asyncio.ensure_future(limits.acquire("c", "m", "t", "L1")) for _ in range(2)]
    await asyncio.sleep(0.01)
    assert queue.waiting() == 2
    assert (await reloader.apply_text(_text(_slots(2)), source="test", origin="memory")).ok
    await asyncio.sleep(0.01)
    assert limits.queues["c"] is queue and queue.max_inflight == 2
    assert sum(w.done() for w in waiters) == 1 and queue.waiting() == 1  # one more slot: one waiter goes
    assert (await reloader.apply_text(_text(_slots(3)), source="test", origin="memory")).ok
    slots = await asyncio.wait_for(asyncio.gather(*waiters), 1)
    assert held is not None and all(s is not None for s in slots) and queue.inflight == 3
    for s in [held, *slots]:
        assert s is not None
        s.release()
    assert queue.inflight == 0


async def test_feedback_of_remaining_clusters_is_kept_and_removed_ones_dropped() -> None:
    live, reloader = _live(_slots(1))
    scheduler = live.current.dispatcher.scheduler
    scheduler.record("c", 0.2, True, now=1.0)
    scheduler.record("free", 0.3, True, now=1.0)
    assert (await reloader.apply_text(_text(_slots(1, keep_deployment=False)), source="test", origin="memory")).ok
    after = live.current.dispatcher.scheduler
    assert after is not scheduler and after.feedback is scheduler.feedback
    assert set(after.feedback.stats) == {"free"} and after.feedback.stats["free"].latency_s == pytest.approx(0.3)


@pytest.mark.parametrize("broken", ["yaml", "reference", "backend"])
async def test_a_config_that_fails_changes_nothing(broken: str) -> None:
    data = _data()
    live, reloader = _live(data)
    before, version = live.current, live.version
    limits_before = before.dispatcher.limiter.config if before.dispatcher.limiter else None
    bad = _with_new_tenant(data)
    if broken == "yaml":
        text = _text(bad) + b"\n  - : ][\n"
    elif broken == "reference":  # parses, but names a strategy nobody defines
        bad["tenants"][-1]["strategy"] = "nonesuch"
        text = _text(bad)
    else:  # validates, but the running limiter cannot change backend without a restart
        bad["ratelimit"]["backend"] = "redis"
        text = _text(bad)
    out = await reloader.apply_text(text, source="test", origin="memory")
    assert not out.ok and out.error and out.version_before == version
    assert live.current is before and live.version == version
    assert before.dispatcher.limiter is not None and before.dispatcher.limiter.config is limits_before
    assert (await _route(live.current, NEW_KEY)).immediate_response.status.code == 401


async def _acked(cp: ControlPlane, version: str) -> dict[str, Any]:
    for _ in range(250):
        if cp.acks_for(version):
            return cp.acks_for(version)[-1]
        await asyncio.sleep(0.02)
    raise AssertionError(f"no ack of {version}: {cp.acks}")


async def test_control_plane_feed_applies_and_acks_ok_and_refused() -> None:
    data = _data()
    live, reloader = _live(data)
    cp = ControlPlane()
    await cp.start()
    feed = ConfigFeed(cp.address, reloader, "test-host/1/0")
    feed.start()
    try:
        good = _text(_with_new_tenant(data))
        version = cp.offer(good)
        assert await _acked(cp, version) == {"worker": "test-host/1/0", "version": version, "ok": True, "error": ""}
        assert live.version == version
        r = await _route(live.current, NEW_KEY)
        assert set_headers(r.request_body.response.header_mutation)["x-modelyard-cluster"]

        applied = live.current
        broken = good.replace(b"strategy: balanced", b"strategy: nonesuch", 1)
        ack = await _acked(cp, cp.offer(broken))
        assert ack["ok"] is False and "nonesuch" in ack["error"]
        assert live.current is applied and live.version == version
        await asyncio.sleep(0.3)
        assert len(cp.acks) == 2  # a refused version is not offered again and again
        assert cp.polls[-1] == {"have": config_version(broken), "worker": "test-host/1/0"}
    finally:
        await feed.close()
        await cp.stop()


async def test_control_plane_down_keeps_the_running_config() -> None:
    live, reloader = _live(_data())
    before = live.current
    feed = ConfigFeed("127.0.0.1:9", reloader, "w")  # nothing listens on the discard port
    feed.start()
    await asyncio.sleep(0.3)
    assert live.current is before and feed._task is not None and not feed._task.done()
    await feed.close()


async def test_reloads_apply_in_the_order_they_came() -> None:
    data = _data()
    live, reloader = _live(data)
    first, second = _text(_with_new_tenant(data)), _text(data)
    outs = await asyncio.gather(reloader.apply_text(first, source="test", origin="1"),
                                reloader.apply_text(second, source="test", origin="2"))
    assert [o.version for o in outs] == [config_version(first), config_version(second)]
    assert outs[1].version_before == outs[0].version and live.version == config_version(second)


async def test_host_slot_table_follows_a_changed_set_of_limited_deployments(tmp_path) -> None:
    """Several workers: another set of limited deployments is another table, and what this worker holds
    moves with it, so the host's bound still counts the calls in flight."""
    config = parse_config(_slots(1))
    limits = ConcurrencyLimits(config, host=(str(tmp_path / "slots"), 0), workers=2)
    gw = Gateway.build(config, limiter=Limiter(config.ratelimit), limits=limits)
    reloader = Reloader(LiveGateway(gw))
    held = await limits.acquire("c", "m", "t", "L1")
    assert held is not None
    more = _slots(1)
    more["models"][0]["deployments"][0]["max_inflight"] = 4  # `free` limited too: a new set
    assert (await reloader.apply_text(_text(more), source="test", origin="memory")).ok
    shared = limits.shared
    assert shared is not None and "free" in shared and shared.held("c") == 1  # carried to the new table
    held.release()
    assert shared.held("c") == 0
    await limits.close()


async def test_warm_ups_and_health_watches_follow_the_reload() -> None:
    """A removed deployment's warm-up and health watch stop (it leaves `warming`); a new one is warmed."""
    def config(*clusters: str) -> dict[str, Any]:
        deps = [{"cluster": c, "protocol": "openai", "endpoints": ["127.0.0.1:9"],  # nothing answers: stays warming
                 "warmup": {"timeout_s": 60, "retry_interval_s": 0.1}, "health_check": {"http_path": "/h"}}
                for c in clusters]
        return {"models": [{"name": "m", "deployments": deps}], "tenants": [{"name": "t", "api_keys": [
            hash_api_key("k")]}]}

    live, _ = _live(config("a", "b"))
    scheduler = live.current.dispatcher.scheduler
    warmer = Warmer(live.current.config, scheduler)
    reloader = Reloader(live, warmer)
    warmer.start()
    try:
        assert scheduler.warming == {"a", "b"} and set(warmer._health_by) == {"a", "b"}
        assert (await reloader.apply_text(_text(config("a", "c")), source="test", origin="memory")).ok
        await asyncio.sleep(0.05)
        assert live.current.dispatcher.scheduler.warming == {"a", "c"}
        assert set(warmer._health_by) == {"a", "c"} and warmer.clusters == ("a", "c")
        assert "b" not in warmer._tasks and not warmer._tasks["a"].done()  # a's warm-up goes on
    finally:
        await warmer.close()


async def test_a_control_plane_that_ignores_have_gets_one_apply_and_no_hot_loop() -> None:
    data = _data()
    live, reloader = _live(data)
    cp = ControlPlane(honour_have=False)
    await cp.start()
    feed = ConfigFeed(cp.address, reloader, "w")
    feed.start()
    try:
        version = cp.offer(_text(_with_new_tenant(data)))
        await _acked(cp, version)
        await asyncio.sleep(1.0)
        assert len(cp.acks) == 1 and live.version == version
        assert len(cp.polls) <= 6  # one a backoff step (0.5 s) apart, not thousands
    finally:
        await feed.close()
        await cp.stop()
