"""The control plane's HTTP API (aiohttp), the wire side of contracts/live_config.py: apply,
status, /metrics, and the extprocs' config long poll and ack."""

from __future__ import annotations

from typing import Any

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from contracts.live_config import ACK_PATH, APPLY_PATH, CONFIG_PATH, STATUS_PATH, VERSION_HEADER, WAIT_S
from controlplane.live.applier import LiveConfig
from controlplane.live.metrics import registry

LIVE: web.AppKey[LiveConfig] = web.AppKey("live", LiveConfig)
REGISTRY: web.AppKey[CollectorRegistry] = web.AppKey("registry", CollectorRegistry)
MAX_CONFIG_BYTES = 16 * 1024 * 1024


def _error(status: int, message: str) -> web.Response:
    return web.json_response({"error": message}, status=status)


async def apply(request: web.Request) -> web.Response:
    live = request.app[LIVE]
    text = await request.read()
    if not text.strip():
        return _error(400, "empty body: POST the config file's text")
    result = await live.apply(text, source=f"apply from {request.remote}")
    return web.json_response(result.body, status=result.status,
                             headers={VERSION_HEADER: live.running.version})


async def config(request: web.Request) -> web.Response:
    """Answer at once when the worker's version is not the running one, else when it changes, else
    304 after `wait` seconds (WAIT_S at most)."""
    live = request.app[LIVE]
    worker, have = request.query.get("worker", ""), request.query.get("have", "")
    if not worker:
        return _error(400, "the worker query parameter is required")
    try:
        wait = min(float(request.query.get("wait", WAIT_S)), WAIT_S)
    except ValueError:
        return _error(400, "wait: expected seconds")
    subs = live.subscribers
    subs.polled(worker, have)
    live.changed.fire()
    try:
        if _holds(live, worker, have):
            await live.published.wait(wait)
        if _holds(live, worker, have):
            return web.Response(status=304, headers={VERSION_HEADER: live.running.version})
        run = live.running
        return web.json_response({"version": run.version, "yaml": run.text.decode("utf-8")},
                                 headers={VERSION_HEADER: run.version})
    finally:
        subs.poll_ended(worker)


def _holds(live: LiveConfig, worker: str, have: str) -> bool:
    """Nothing to hand this worker: it runs the current version, or refused it (offering it again
    would loop until the next apply)."""
    w = live.subscribers.workers.get(worker)
    return have == live.running.version or (w is not None and w.refused == live.running.version)


async def ack(request: web.Request) -> web.Response:
    live = request.app[LIVE]
    try:
        body: Any = await request.json()
    except ValueError:
        return _error(400, "expected a JSON body")
    if not isinstance(body, dict) or not isinstance(body.get("worker"), str) \
            or not isinstance(body.get("version"), str) or not isinstance(body.get("ok"), bool):
        return _error(400, 'expected {"worker": str, "version": str, "ok": bool, "error": str}')
    error = body.get("error")
    live.subscribers.acked(body["worker"], body["version"], body["ok"], error if isinstance(error, str) else "")
    live.changed.fire()
    return web.json_response({"version": live.running.version})


async def status(request: web.Request) -> web.Response:
    live = request.app[LIVE]
    return web.json_response(live.status(), headers={VERSION_HEADER: live.running.version})


async def metrics(request: web.Request) -> web.Response:
    body = generate_latest(request.app[REGISTRY])
    return web.Response(body=body, headers={"content-type": CONTENT_TYPE_LATEST})


def build_app(live: LiveConfig) -> web.Application:
    app = web.Application(client_max_size=MAX_CONFIG_BYTES)
    app[LIVE] = live
    app[REGISTRY] = registry(live)
    app.router.add_post(APPLY_PATH, apply)
    app.router.add_get(CONFIG_PATH, config)
    app.router.add_post(ACK_PATH, ack)
    app.router.add_get(STATUS_PATH, status)
    app.router.add_get("/metrics", metrics)
    return app
