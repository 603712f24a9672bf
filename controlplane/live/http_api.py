"""The control plane's HTTP API (aiohttp), the wire side of contracts/live_config.py: apply,
status, /metrics, and the extprocs' config long poll and ack."""

from __future__ import annotations

import hmac
import os
from typing import Any

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from contracts.live_config import ACK_PATH, APPLY_PATH, CONFIG_PATH, STATUS_PATH, TEXT_PATH, VERSION_HEADER, WAIT_S
from controlplane.live.applier import LiveConfig
from controlplane.live.metrics import registry
from controlplane.live.wire import APPLIED_BY_HEADER, TOKEN_ENV

LIVE: web.AppKey[LiveConfig] = web.AppKey("live", LiveConfig)
REGISTRY: web.AppKey[CollectorRegistry] = web.AppKey("registry", CollectorRegistry)
MAX_CONFIG_BYTES = 16 * 1024 * 1024


def _error(status: int, message: str) -> web.Response:
    return web.json_response({"error": message}, status=status)


async def apply(request: web.Request) -> web.Response:
    live = request.app[LIVE]
    token = os.environ.get(TOKEN_ENV)
    if token and not hmac.compare_digest(request.headers.get("authorization", ""), f"Bearer {token}"):
        return _error(401, f"an apply needs the control plane's token (${TOKEN_ENV}) as a bearer token")
    text = await request.read()
    if not text.strip():
        return _error(400, "empty body: POST the config file's text")
    # Who says they applied it (the CLI sends user@host), for the log, the status and the extprocs' audit.
    who = request.headers.get(APPLIED_BY_HEADER, "")[:200] or "unknown"
    result = await live.apply(text, source=f"apply from {request.remote}", applied_by=who)
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
        return web.json_response({"version": run.version, "yaml": run.text.decode("utf-8"),
                                  "applied_by": live.applied_by},
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


async def text(request: web.Request) -> web.Response:
    live = request.app[LIVE]
    return web.json_response(live.text(), headers={VERSION_HEADER: live.running.version})


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
    app.router.add_get(TEXT_PATH, text)
    app.router.add_get("/metrics", metrics)
    return app
