"""The agent over a real socket, and pollers reading it (and a DCGM-style endpoint)."""

import asyncio
import logging
import time

import aiohttp
import orjson
import pytest
from aiohttp import web

from contracts.config import WatermarkSource
from extproc.routing import NoRoute, RouteRequest, Scheduler
from extproc.routing.watermarks import parse_dcgm_metrics
from extproc.telemetry.pollers import WatermarkBoard, WatermarkPoller
from gpuagent.agent import EXIT_NO_NVML, FakeSource, NvmlSource, NvmlUnavailable, main, make_app

from .conftest import dep, make_config, model
from .dcgm_sample import DCGM_SAMPLE

INTERVAL = 0.3


async def serve(app: web.Application):
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]
    return runner, f"http://127.0.0.1:{port}"


@pytest.fixture
async def agent():
    source = FakeSource(util=0.3, mem=0.2)
    runner, base = await serve(make_app(source))
    yield source, base
    await runner.cleanup()


def _has_nvml() -> bool:
    try:
        NvmlSource()
    except NvmlUnavailable:
        return False
    return True


def test_without_nvml_the_agent_says_so_and_exits_2(caplog):
    if _has_nvml():
        pytest.skip("this machine has NVML")
    with pytest.raises(NvmlUnavailable, match="NVML"):
        NvmlSource()
    with caplog.at_level(logging.ERROR, logger="modelyard.agent"):
        assert main(["--port", "0"]) == EXIT_NO_NVML
    assert "NVML is not available" in caplog.text and "--fake" in caplog.text


@pytest.mark.gpu
def test_nvml_source_reads_gpus():
    if not _has_nvml():
        pytest.skip("no NVML device")
    gpus = NvmlSource().read()
    assert gpus and all(0 <= g.util <= 100 and g.mem_total > 0 for g in gpus)


async def test_agent_endpoints(agent):
    source, base = agent
    async with aiohttp.ClientSession() as s:
        async with s.get(base + "/watermarks") as r:
            doc = await r.json()
        assert doc["source"] == "fake" and doc["watermark"] == pytest.approx(0.3)
        assert doc["gpus"][0]["util"] == pytest.approx(30.0) and "ts" in doc
        async with s.get(base + "/metrics") as r:
            text = await r.text()
        assert 'modelyard_gpu_watermark{source="fake"} 0.3' in text
        assert 'modelyard_gpu_utilization{gpu="0"} 0.3' in text
        async with s.post(base + "/fake", data=b'{"util": 2}') as r:
            assert r.status == 400 and "fraction" in (await r.json())["error"]
        async with s.post(base + "/fake", data=b"nope") as r:
            assert r.status == 400
        async with s.post(base + "/fake", data=b'{"util": 0.1, "mem": 0.6, "gpus": 2}') as r:
            assert r.status == 200 and (await r.json())["watermark"] == pytest.approx(0.6)


async def test_nvml_agent_refuses_post_fake():
    class Static:
        name = "nvml"

        def read(self):
            return FakeSource(0.1).read()

    runner, base = await serve(make_app(Static()))
    try:
        async with aiohttp.ClientSession() as s, s.post(base + "/fake", data=b"{}") as r:
            assert r.status == 409
    finally:
        await runner.cleanup()


async def test_fake_file_is_reread(tmp_path):
    spec = tmp_path / "wm.json"
    spec.write_bytes(orjson.dumps({"util": 0.1}))
    runner, base = await serve(make_app(FakeSource(path=str(spec))))
    try:
        async with aiohttp.ClientSession() as s:
            async with s.get(base + "/watermarks") as r:
                assert (await r.json())["watermark"] == pytest.approx(0.1)
            spec.write_bytes(orjson.dumps({"gpus": [{"util": 10, "mem_used": 8, "mem_total": 10}]}))
            async with s.get(base + "/watermarks") as r:
                assert (await r.json())["watermark"] == pytest.approx(0.8)
            spec.write_bytes(b"{broken")
            async with s.get(base + "/watermarks") as r:
                assert r.status == 500 and "fake file" in (await r.json())["error"]
    finally:
        await runner.cleanup()


async def test_poller_sees_a_change_within_one_interval(agent):
    source, base = agent
    board = WatermarkBoard({"gpu-a": WatermarkSource(url=base + "/watermarks")}, interval_s=INTERVAL)
    await board.start(first_poll_timeout=2.0)
    try:
        assert board.readings["gpu-a"].watermark == pytest.approx(0.3)
        poller = board.pollers["gpu-a"]
        async with aiohttp.ClientSession() as s, s.post(base + "/fake", data=b'{"util": 0.95}') as r:
            assert r.status == 200
        # Counted in polls, not wall time (a loaded box stretches both): a poll already in flight
        # may bring the old reading, the next one must bring the change.
        polls = 0
        while True:
            reading = await poller.wait_for_update(timeout=10 * INTERVAL)
            assert reading is not None, "no poll within ten intervals"
            polls += 1
            if reading.watermark >= 0.95:
                break
        assert polls <= 2
        assert board.readings["gpu-a"].watermark == pytest.approx(0.95)
    finally:
        await board.stop()


async def test_scheduler_with_live_board_and_dead_agent(agent):
    """End to end: live readings steer the choice; an agent that stops answering goes stale."""
    source, base = agent
    dead = WatermarkSource(url="http://127.0.0.1:9/watermarks")  # nothing listens on port 9
    cfg = make_config([model("m", [dep("live"), dep("gone")])])
    board = WatermarkBoard(
        {"live": WatermarkSource(url=base + "/watermarks"), "gone": dead}, interval_s=INTERVAL
    )
    await board.start(first_poll_timeout=2.0)
    try:
        s = Scheduler(cfg)
        d = s.decide(RouteRequest("m", cfg.tenants[0]), time.monotonic(), board.readings)
        assert [c.cluster for c in d.candidates] == ["live"]
        assert d.rejected[0].reason == "no watermark reading"
        assert board.pollers["gone"].errors >= 1 and board.pollers["gone"].last_error
        # Saturate the live one: within an interval the scheduler has nowhere to go.
        async with aiohttp.ClientSession() as c, c.post(base + "/fake", data=b'{"util": 0.95}') as r:
            assert r.status == 200
        while (reading := await board.pollers["live"].wait_for_update(timeout=10 * INTERVAL)) is not None \
                and reading.watermark < 0.95:
            pass  # a poll sent before the change may answer with the old reading
        assert reading is not None, "no poll within ten intervals"
        with pytest.raises(NoRoute) as e:
            s.decide(RouteRequest("m", cfg.tenants[0]), time.monotonic(), board.readings)
        assert e.value.status == 503
    finally:
        await board.stop()
    # Stopped board: the last reading ages past 3 intervals and counts as saturated.
    stale_now = board.readings["live"].ts + 3 * INTERVAL + 0.01
    with pytest.raises(NoRoute) as e:
        Scheduler(cfg).decide(RouteRequest("m", cfg.tenants[0]), stale_now, board.readings)
    assert any("stale" in r.reason or "saturated" in r.reason for r in e.value.rejected)


async def test_poller_reads_dcgm_exporter():
    app = web.Application()

    async def metrics(_):
        return web.Response(text=DCGM_SAMPLE, content_type="text/plain")

    app.router.add_get("/metrics", metrics)
    runner, base = await serve(app)
    try:
        poller = WatermarkPoller("dcgm-node", WatermarkSource(url=base + "/metrics", kind="dcgm"), INTERVAL)
        async with aiohttp.ClientSession() as s:
            r = await poller.poll_once(s)
        assert r is not None and r.source == "dcgm"
        assert r.watermark == pytest.approx(parse_dcgm_metrics(DCGM_SAMPLE).watermark)
    finally:
        await runner.cleanup()


async def test_poller_keeps_last_reading_on_bad_answers(agent):
    source, base = agent
    poller = WatermarkPoller("a", WatermarkSource(url=base + "/watermarks"), INTERVAL)
    async with aiohttp.ClientSession() as s:
        first = await poller.poll_once(s)
        poller.source = WatermarkSource(url=base + "/metrics")  # Prometheus text is not agent JSON
        assert await poller.poll_once(s) is None
        poller.source = WatermarkSource(url=base + "/missing")
        assert await poller.poll_once(s) is None
    assert poller.reading is first and poller.errors == 2 and "HTTP 404" in poller.last_error


def test_board_from_config():
    cfg = make_config([model("m", [dep("a"), dep("b", monitored=False)])])
    board = WatermarkBoard.from_config(cfg, interval_s=0.5)
    assert set(board.pollers) == {"a"} and board.pollers["a"].interval_s == 0.5


async def test_board_start_survives_a_slow_first_round():
    """A source that never answers must not keep the gateway from starting."""
    hold = asyncio.Event()

    async def slow(_):
        await hold.wait()
        return web.Response(text="{}")

    app = web.Application()
    app.router.add_get("/watermarks", slow)
    runner, base = await serve(app)
    board = WatermarkBoard({"slow": WatermarkSource(url=base + "/watermarks")}, interval_s=5.0)
    try:
        await board.start(first_poll_timeout=0.1)
        assert board.readings == {}
    finally:
        await board.close()
        hold.set()
        await runner.cleanup()


async def test_poller_exports_reading_time_and_poll_errors(agent):
    from prometheus_client import REGISTRY

    _, base = agent
    cluster = "freshness-test"
    WatermarkBoard({cluster: WatermarkSource(url=f"{base}/watermarks")})
    assert REGISTRY.get_sample_value("modelyard_watermark_poll_errors_total", {"cluster": cluster}) == 0
    # A poll's timeout is its interval: 0.3 s timed out on a loaded box, and this test is not about time.
    poller = WatermarkPoller(cluster, WatermarkSource(url=f"{base}/watermarks"), interval_s=10.0)
    before = time.time()
    async with aiohttp.ClientSession() as session:
        assert await poller.poll_once(session) is not None
        read_at = REGISTRY.get_sample_value("modelyard_watermark_last_reading_timestamp_seconds",
                                            {"cluster": cluster})
        assert read_at is not None and before <= read_at <= time.time()
        poller.source = WatermarkSource(url=f"{base}/no-such-path")
        assert await poller.poll_once(session) is None
    assert REGISTRY.get_sample_value("modelyard_watermark_poll_errors_total", {"cluster": cluster}) == 1
    # A failed poll leaves the last good reading's time where it was: its age is what alerts watch.
    assert REGISTRY.get_sample_value("modelyard_watermark_last_reading_timestamp_seconds",
                                     {"cluster": cluster}) == read_at


async def test_a_reload_keeps_unchanged_pollers_and_swaps_the_rest(agent):
    """extproc/live/reload.py: an unchanged source keeps its poller (and last reading); a removed one stops and
    its reading goes; a new one polls from now on."""
    _, base = agent
    same = WatermarkSource(url=base + "/watermarks")
    board = WatermarkBoard({"keep": same, "drop": WatermarkSource(url=base + "/watermarks?x=1")},
                           interval_s=INTERVAL)
    await board.start(first_poll_timeout=2.0)
    try:
        kept = board.pollers["keep"]
        assert set(board.readings) == {"keep", "drop"}
        board.reconfigure({"keep": same, "new": WatermarkSource(url=base + "/watermarks?x=2")}, INTERVAL)
        assert board.pollers["keep"] is kept and "drop" not in board.readings and "drop" not in board.pollers
        assert await board.pollers["new"].wait_for_update(timeout=4 * INTERVAL) is not None
        assert "new" in board.readings and "keep" in board.readings
        await asyncio.sleep(2 * INTERVAL)
        assert "drop" not in board.readings  # its poller really stopped
    finally:
        await board.stop()
