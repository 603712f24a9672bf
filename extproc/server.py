"""The thin gRPC shell: ExternalProcessor streams in, one `Session` per stream.

Also serves gRPC health (NOT_SERVING while draining) and, on the same port, any extra services
(Envoy's rate limit service). grpc.aio serves TCP; the Unix socket Envoy uses when the extproc is
local is served straight on h2 (extproc/h2_grpc.py) unless `extproc.unix_socket_server: grpcio`.
SIGTERM/SIGINT: stop accepting, drain open streams, exit 0.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import signal
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import grpc
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as ext_grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from contracts.compiled import loaded
from contracts.config import GatewayConfig
from contracts.envoy_names import BODIES_METADATA, BUFFER_LIMIT_METADATA, XLATE_METADATA
from extproc.context import Interim
from extproc.duplex import DuplexSession
from extproc.gateway import Gateway, LiveGateway
from extproc.grpc_services import Services
from extproc.h2_grpc import H2GrpcServer
from extproc.messages import ProcessingResponse
from extproc.routes import RouteTable
from extproc.session import Session
from extproc.telemetry.metrics import BUILD

log = logging.getLogger("modelyard.server")

_SERVICE = "envoy.service.ext_proc.v3.ExternalProcessor"
# On SIGTERM, report NOT_SERVING this long before closing the port: Envoy's gRPC health check
# (every 1 s, controlplane.bootstrap) takes the replica out within two checks while it still accepts streams.
UNREADY_BEFORE_DRAIN_S = 2.5


class ExternalProcessor(ext_grpc.ExternalProcessorServicer):
    def __init__(self, live: LiveGateway, routes: RouteTable):
        self.live = live
        self.routes = routes

    async def Process(self, request_iterator: AsyncIterator, context: grpc.aio.ServicerContext) -> None:  # noqa: N802
        # Translation hops (Envoy internal listeners) mark their streams in the gRPC metadata, and so do
        # the routes whose bodies run full duplex.
        xlate = limit = None
        duplex = False
        for k, v in context.invocation_metadata() or ():
            if k == XLATE_METADATA:
                xlate = v if isinstance(v, str) else v.decode("ascii", "replace")
            elif k == BODIES_METADATA:
                duplex = v in ("duplex", b"duplex")
            elif k == BUFFER_LIMIT_METADATA and v.isdigit():
                limit = int(v)
        # The snapshot running now: this stream keeps it to its end, whatever a reload swaps in meanwhile.
        gateway = self.live.current
        session = Session(gateway, self.routes, xlate=xlate)
        if duplex:  # gathering no more of a body than Envoy would have buffered
            await self._duplex(DuplexSession(session, limit or gateway.config.extproc.max_body_bytes), context)
            return
        # read()/write() on the context, not the iterator and a generator: grpc.aio's iterator
        # wrappers cost about a fifth of the extproc's CPU per request under load.
        try:
            while (req := await context.read()) is not grpc.aio.EOF:
                resp = await session.handle(req)
                if resp is not None:
                    await _write(context, resp)
        finally:
            session.close()

    @staticmethod
    async def _duplex(session: DuplexSession, context: grpc.aio.ServicerContext) -> None:
        # The h2 socket says when Envoy's next message is already here: a stream's chunks that came
        # together are answered together (grpc.aio cannot tell).
        waiting: Callable[[], bool] = getattr(context, "waiting", _nothing_waits)
        try:
            while (req := await context.read()) is not grpc.aio.EOF:
                for resp in await session.handle(req, more=waiting()):
                    await _write(context, resp)
        finally:
            session.close()


async def _write(context: grpc.aio.ServicerContext, resp: ProcessingResponse | Interim) -> None:
    while isinstance(resp, Interim):  # a step that waits on purpose keeps Envoy's timer going
        await context.write(resp.message)
        resp = await resp.then()
    await context.write(resp)


def _nothing_waits() -> bool:
    return False


def settle_heap() -> None:
    """Put what start-up built (config, protos, the gateway: ~100k objects) out of the cyclic collector's
    sight: a full collection walked it all, 40-70 ms with every call waiting (docs/performance.md)."""
    gc.collect()
    gc.freeze()


class ExtprocServer:
    """Owns the gRPC server's lifecycle; `build_gateway` wires the feature parts from config."""

    def __init__(self, config: GatewayConfig, gateway: Gateway | LiveGateway, routes: RouteTable):
        self.config = config
        self.live = gateway if isinstance(gateway, LiveGateway) else LiveGateway(gateway)
        limit = config.extproc.max_body_bytes + 1024 * 1024  # a body and its message's other fields
        # gRPC binds with SO_REUSEPORT by default: a second server on a taken port would silently share it.
        self.server = grpc.aio.server(options=[
            ("grpc.so_reuseport", 0),
            ("grpc.max_receive_message_length", limit),
            ("grpc.max_send_message_length", limit),
        ])
        # Every servicer is added here: grpc.aio gets it, and the h2 socket serves the same handlers.
        self.services = Services(self.server)
        self.health = health.aio.HealthServicer() if hasattr(health, "aio") else health.HealthServicer()
        ext_grpc.add_ExternalProcessorServicer_to_server(ExternalProcessor(self.live, routes), self.services)
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self.services)
        # The socket before the TCP port: whoever waits for the port (a supervisor, a test's stack) then finds
        # Envoy's way in bound too, not a killed predecessor's socket file refusing connections.
        self.socket: H2GrpcServer | None = None
        sock = config.extproc.unix_socket
        if sock:  # Envoy's way in when local; TCP stays for probes and remote peers
            Path(sock).parent.mkdir(parents=True, exist_ok=True)
            if config.extproc.unix_socket_server == "h2":
                self.socket = H2GrpcServer(self.services, sock, max_message=limit)
                try:
                    self.socket.bind()
                except OSError as e:
                    raise OSError(f"extproc.unix_socket {sock}: cannot listen there ({e.strerror})") from None
            else:
                self._listen(f"unix:{sock}", "extproc.unix_socket")
        self.port = self._listen(config.extproc.address, "extproc.address")
        self._stopping = asyncio.Event()

    def _listen(self, address: str, field: str) -> int:
        try:
            return self.server.add_insecure_port(address)
        except RuntimeError:  # grpc says only "failed to bind"; the operator needs the field and address
            raise OSError(f"{field} {address}: cannot listen there (another process holds it?)") from None

    @property
    def gateway(self) -> Gateway:
        """The running snapshot (its shared parts: tasks, audit, metering, are every snapshot's)."""
        return self.live.current

    async def start(self) -> None:
        if self.socket is not None:
            await self.socket.start()
        await self.server.start()
        await self._set_health(health_pb2.HealthCheckResponse.SERVING)
        self.gateway.start()
        BUILD.labels(loaded()).set(1)
        ext = self.config.extproc
        log.info("extproc listening on %s%s (%s build)", ext.address,
                 f" and unix:{ext.unix_socket} ({ext.unix_socket_server})" if ext.unix_socket else "", loaded())

    async def _set_health(self, status: int) -> None:
        for name in ("", _SERVICE):
            res = self.health.set(name, status)
            if asyncio.iscoroutine(res):
                await res

    async def stop(self, grace: float | None = None) -> None:
        await self._set_health(health_pb2.HealthCheckResponse.NOT_SERVING)
        self.gateway.drain()
        # grpc.aio's grace lets open streams finish while refusing new ones; the socket's does the same.
        grace = self.config.extproc.drain_seconds if grace is None else grace
        if self.socket is not None:
            await asyncio.gather(self.server.stop(grace), self.socket.stop(grace))
        else:
            await self.server.stop(grace)
        await self.gateway.close()

    def request_stop(self) -> None:
        self._stopping.set()

    async def serve_until_signal(self, on_stop: Callable[[], object] | None = None) -> None:
        """Serve until SIGTERM/SIGINT, then drain; `on_stop` runs first (the other workers drain too)."""
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self.request_stop)
        await self.start()
        settle_heap()
        await self._stopping.wait()
        if on_stop is not None:
            on_stop()
        await self._set_health(health_pb2.HealthCheckResponse.NOT_SERVING)
        await asyncio.sleep(UNREADY_BEFORE_DRAIN_S)
        log.info("draining open streams (up to %.0fs)", self.config.extproc.drain_seconds)
        await self.stop()
        log.info("stopped")
