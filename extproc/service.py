"""The composition root: build the gateway's parts from config and run the extproc service."""

from __future__ import annotations

import asyncio
import logging

from extproc.config import GatewayConfig
from extproc.gateway import Gateway
from extproc.metrics import serve_metrics
from extproc.server import ExtprocServer

log = logging.getLogger("modelyard.service")


def build_gateway(config: GatewayConfig) -> tuple[Gateway, list]:
    """The gateway plus the extra gRPC services to serve beside ext_proc."""
    gateway = Gateway(config)
    return gateway, []


async def run_service(config: GatewayConfig, *, metrics: bool = True) -> None:
    gateway, extra = build_gateway(config)
    server = ExtprocServer(config, gateway, extra_services=extra)
    if metrics and config.extproc.metrics_address:
        serve_metrics(config.extproc.metrics_address)
    await server.serve_until_signal()


def serve(config: GatewayConfig) -> int:
    asyncio.run(run_service(config))
    return 0
