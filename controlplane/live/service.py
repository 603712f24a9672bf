"""`modelyard controlplane`: the ADS server for Envoy and the HTTP API on one event loop."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from pathlib import Path

import grpc
from aiohttp import web

from contracts.errors import ConfigError
from controlplane.environments import EnvironmentConfig
from controlplane.live.ads import add_to_server
from controlplane.live.applier import LiveConfig
from controlplane.live.http_api import build_app
from controlplane.live.validation import candidate
from controlplane.live.watch import watch_file

log = logging.getLogger("modelyard.controlplane")


def _split(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    return host.strip("[]") or "0.0.0.0", int(port)


def _listen_at(address: str, bind: str | None) -> str:
    """The address to listen on: the config's, or its port on `bind` (in a container the config names
    the Service others dial, which is not an address of this pod)."""
    if bind is None:
        return address
    _, port = _split(address)
    return f"[{bind}]:{port}" if ":" in bind else f"{bind}:{port}"


async def run(path: Path, env: EnvironmentConfig, *, watch: bool = False, timeout_s: float = 30.0,
              bind: str | None = None) -> None:
    """Raises ConfigError when the starting file does not validate."""
    try:
        text = path.read_bytes()
    except OSError as e:
        raise ConfigError(f"{path}: cannot read ({e.strerror})") from None
    first = await asyncio.to_thread(candidate, text, env, None, str(path))
    live = LiveConfig(env, first, timeout_s=timeout_s)
    cp = first.cfg.controlplane
    # Pings find an Envoy whose host vanished without a FIN: its stream closes, and applies stop waiting for it.
    # No SO_REUSEPORT (gRPC's default): a second control plane on a taken port must fail, not share it.
    server = grpc.aio.server(options=[("grpc.so_reuseport", 0), ("grpc.keepalive_time_ms", 30_000), ("grpc.keepalive_timeout_ms", 10_000),
                                      ("grpc.keepalive_permit_without_calls", 1)])
    add_to_server(live.ads, server)
    xds_at, api_at = _listen_at(cp.xds_address, bind), _listen_at(cp.api_address, bind)
    if server.add_insecure_port(xds_at) == 0:
        raise OSError(f"controlplane.xds_address {xds_at}: cannot listen there")
    await server.start()
    # Extprocs hold long polls open (up to WAIT_S): a stop answers them by closing, not by waiting them out.
    runner = web.AppRunner(build_app(live), access_log=None, shutdown_timeout=1.0)
    await runner.setup()
    host, port = _split(api_at)
    await web.TCPSite(runner, host, port).start()
    log.info("control plane: ADS on %s, API on %s, config %s version %s%s", xds_at, api_at,
             path, first.version, " (watching the file)" if watch else "")
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    watcher = asyncio.create_task(watch_file(path, live)) if watch else None
    try:
        await stop.wait()
    finally:
        if watcher is not None:
            watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watcher
        await server.stop(grace=1)
        await runner.cleanup()
