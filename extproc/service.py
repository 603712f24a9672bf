"""The composition root: build the gateway's parts from config and run the extproc service."""

from __future__ import annotations

import asyncio
import logging
import signal

from extproc.config import GatewayConfig, config_path, load_config
from extproc.gateway import Gateway
from extproc.metrics import serve_metrics
from extproc.server import ExtprocServer
from modelyard.errors import ConfigError

log = logging.getLogger("modelyard.service")


def build_gateway(config: GatewayConfig) -> tuple[Gateway, list]:
    """The gateway plus the extra gRPC services to serve beside ext_proc."""
    from extproc.batching import Batcher
    from extproc.metering import MeteringStore
    from extproc.metrics import IMAGE_BACKEND
    from extproc.routing import Scheduler
    from extproc.telemetry.pollers import WatermarkBoard
    from kernels import select_backend
    from ratelimit import Limiter
    from ratelimit.rls import add_to_server

    try:
        limiter = Limiter(config.ratelimit)
        scheduler = Scheduler(config)
    except ValueError as e:
        raise ConfigError(str(e)) from None
    board = WatermarkBoard.from_config(config, scheduler.settings.watermarks.interval_s)
    metering = MeteringStore(config.extproc.metering_db) if config.extproc.metering_db else None
    # Image preprocessing: CuPy when a device is present (or asked for), else NumPy.
    backend = select_backend(config.extproc.image_backend)
    IMAGE_BACKEND.labels(backend.name).set(1)
    log.info("image preprocessing backend: %s (preference %s)", backend.name, config.extproc.image_backend)
    gateway = Gateway(config, scheduler=scheduler, limiter=limiter, watermarks=board, image_backend=backend,
                      batcher=Batcher(), metering=metering)
    # Envoy's native ratelimit filter (staging env) asks the same buckets on the same port.
    return gateway, [lambda server: add_to_server(server, limiter)]


def reload_limits(gateway: Gateway, path: str | None) -> None:
    """SIGHUP: re-read the config file and apply its rate limits; buckets keep their level."""
    try:
        fresh = load_config(path)
        gateway.limiter.reload(fresh.ratelimit)
        log.info("rate limits reloaded from %s", config_path(path))
    except (ConfigError, ValueError) as e:
        log.error("reload refused, keeping the running limits: %s", e)


async def run_service(config: GatewayConfig, *, path: str | None = None, metrics: bool = True) -> None:
    gateway, extra = build_gateway(config)
    server = ExtprocServer(config, gateway, extra_services=extra)
    asyncio.get_running_loop().add_signal_handler(signal.SIGHUP, reload_limits, gateway, path)
    # Pollers run in the background; the first readings are in before traffic is accepted.
    await gateway.watermarks.start(first_poll_timeout=2.0)
    if metrics and config.extproc.metrics_address:
        serve_metrics(config.extproc.metrics_address)
    await server.serve_until_signal()


def serve(path: str | None) -> int:
    config = load_config(path)
    asyncio.run(run_service(config, path=path))
    return 0
