"""The ADS gRPC service (grpc.aio): one task reads an Envoy's requests, the handler writes what
the ledger answers and what `push` queues. The decisions are the ledger's (ledger.py)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable

import grpc
from envoy.service.discovery.v3 import ads_pb2_grpc, discovery_pb2

from controlplane.live.ledger import Ledger

log = logging.getLogger("modelyard.controlplane.ads")


class AdsService(ads_pb2_grpc.AggregatedDiscoveryServiceServicer):
    def __init__(self, ledger: Ledger, on_change: Callable[[], None]) -> None:
        self.ledger = ledger
        self._on_change = on_change  # an ACK or NACK arrived: wake whoever waits on Envoy
        self._queues: dict[int, asyncio.Queue[discovery_pb2.DiscoveryResponse | None]] = {}

    def push(self) -> None:
        """Send the ledger's current snapshot to every stream."""
        for sid, responses in self.ledger.push_all().items():
            q = self._queues.get(sid)
            if q is not None:
                for r in responses:
                    q.put_nowait(r)

    async def StreamAggregatedResources(  # noqa: N802 (the gRPC method's name)
            self, request_iterator: AsyncIterator[discovery_pb2.DiscoveryRequest],
            context: grpc.aio.ServicerContext) -> AsyncIterator[discovery_pb2.DiscoveryResponse]:
        stream = self.ledger.open(context.peer())
        q: asyncio.Queue[discovery_pb2.DiscoveryResponse | None] = asyncio.Queue()
        self._queues[stream.id] = q
        log.info("envoy stream %d opened from %s", stream.id, stream.peer)

        async def read() -> None:
            try:
                async for req in request_iterator:
                    responses, rollback = self.ledger.hear(stream, req)
                    if req.HasField("error_detail"):
                        log.error("envoy %s refused its %s update (nonce %s, it keeps %s): %s",
                                  stream.node or stream.peer, req.type_url.rsplit(".", 1)[-1], req.response_nonce,
                                  req.version_info or "nothing", req.error_detail.message)
                    for r in responses:
                        q.put_nowait(r)
                    if rollback:
                        log.warning("serving the last good config again (version %s)",
                                    self.ledger.current.snapshot.version if self.ledger.current else "?")
                        self.push()
                    self._on_change()
            except Exception:
                log.exception("envoy stream %d: dropped; Envoy reconnects and is served afresh", stream.id)
            finally:
                q.put_nowait(None)

        reader = asyncio.create_task(read())
        try:
            while (r := await q.get()) is not None:
                yield r
        finally:
            reader.cancel()
            self._queues.pop(stream.id, None)
            self.ledger.close(stream)
            self._on_change()
            log.info("envoy stream %d closed", stream.id)

    async def DeltaAggregatedResources(  # noqa: N802
            self, request_iterator: AsyncIterator[discovery_pb2.DeltaDiscoveryRequest],
            context: grpc.aio.ServicerContext) -> AsyncIterator[discovery_pb2.DeltaDiscoveryResponse]:
        await context.abort(grpc.StatusCode.UNIMPLEMENTED, "State of the World ADS only (api_type: GRPC)")
        yield discovery_pb2.DeltaDiscoveryResponse()  # unreachable: makes this an async generator


def add_to_server(service: AdsService, server: grpc.aio.Server) -> None:
    ads_pb2_grpc.add_AggregatedDiscoveryServiceServicer_to_server(service, server)
