"""`modelyard epp`: the grpc.aio shell of the endpoint picker. One `EppStream` per ext_proc stream;
the replica board polls the pool's model servers in the background; gRPC health answers the
protocol's services (`liveness`, `readiness`, the ext_proc service) and the empty name."""

from __future__ import annotations

import asyncio
import logging
import signal

import grpc
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as ext_grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from contracts.config.endpoint_picker import EndpointPickerConfig
from extproc.epp.kubeapi import ClusterSource
from extproc.epp.members import PoolMembers
from extproc.epp.stream import EppStream
from extproc.replicas.board import ReplicaBoard
from extproc.telemetry.metrics import serve_metrics

log = logging.getLogger("modelyard.epp")

HEALTH_SERVICES = ("", "liveness", "readiness", "envoy.service.ext_proc.v3.ExternalProcessor")
FIRST_POLL_TIMEOUT_S = 2.0
CLUSTER_SYNC_TIMEOUT_S = 10.0


class EndpointPicker(ext_grpc.ExternalProcessorServicer):
    def __init__(self, config: EndpointPickerConfig, board: ReplicaBoard,
                 objectives: dict[str, int] | None = None) -> None:
        self.config = config
        self.board = board
        self.objectives = objectives  # updated in place by the cluster watch

    async def Process(self, request_iterator: object, context: grpc.aio.ServicerContext) -> None:  # noqa: N802
        stream = EppStream(self.config, self.board, self.objectives)
        try:
            while (req := await context.read()) is not grpc.aio.EOF:
                for resp in stream.handle(req):
                    await context.write(resp)
        finally:
            stream.close()


class EppServer:
    def __init__(self, config: EndpointPickerConfig) -> None:
        self.config = config
        self.board = ReplicaBoard([])
        self.objectives = dict(config.objectives)
        self.from_cluster: list[str] = []  # the pool's ready pods, when the picker watches the API
        self.cluster: ClusterSource | None = None
        if config.kubernetes is not None:
            self.cluster = ClusterSource(config.kubernetes, config.pool, self._set_cluster_members,
                                         self._set_cluster_objectives)
        self.members = PoolMembers(config, self._set_members)
        if config.endpoints_file is not None:
            self.members.load_file(self.members.read_file())
        self._set_members(self.members.current)
        limit = config.max_body_bytes + 1024 * 1024
        # No SO_REUSEPORT (gRPC's default): a picker started on a taken port must fail, not share it.
        self.server = grpc.aio.server(options=[("grpc.so_reuseport", 0), ("grpc.max_receive_message_length", limit),
                                               ("grpc.max_send_message_length", limit)])
        self.health = health.aio.HealthServicer()
        ext_grpc.add_ExternalProcessorServicer_to_server(EndpointPicker(config, self.board, self.objectives),
                                                        self.server)
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self.server)
        self.port = self.server.add_insecure_port(config.address)
        self._tasks: list[asyncio.Task[None]] = []
        self._stopping = asyncio.Event()

    def _set_members(self, endpoints: list[str]) -> None:
        members = list(dict.fromkeys([*endpoints, *self.from_cluster]))
        self.board.reconfigure_sets({self.config.pool: (members, self.config.replica_metrics)}, keep_members=True)

    def _set_cluster_members(self, endpoints: list[str]) -> None:
        """The pod watch's ready endpoints: new ones are polled from now on, gone ones' readings dropped."""
        log.info("endpoint picker: pool %s pods ready: %s", self.config.pool, ", ".join(endpoints) or "none")
        self.from_cluster = endpoints
        self._set_members(self.members.current)

    def _set_cluster_objectives(self, priorities: dict[str, int]) -> None:
        # In place: every stream reads this dict; the cluster's objectives override the config's.
        merged = {**self.config.objectives, **priorities}
        if merged != self.objectives:
            log.info("endpoint picker: objectives %s", merged)
            self.objectives.clear()
            self.objectives.update(merged)

    async def _set_health(self, status: int) -> None:
        for name in HEALTH_SERVICES:
            await self.health.set(name, status)

    async def start(self) -> None:
        await self._set_health(health_pb2.HealthCheckResponse.NOT_SERVING)
        await self.server.start()
        if self.cluster is not None:
            await self.cluster.start()
            try:  # readiness waits for the first pod list, as for the first readings
                await asyncio.wait_for(self.cluster.synced.wait(), CLUSTER_SYNC_TIMEOUT_S)
            except TimeoutError:
                log.warning("endpoint picker: no pod list from the API within %.0fs", CLUSTER_SYNC_TIMEOUT_S)
        await self.board.start(first_poll_timeout=FIRST_POLL_TIMEOUT_S)  # readiness: the first readings are in
        self._tasks.append(asyncio.create_task(self.members.watch(), name="epp:members"))
        await self._set_health(health_pb2.HealthCheckResponse.SERVING)
        log.info("endpoint picker for InferencePool %s on %s: %s", self.config.pool, self.config.address,
                 ", ".join(self.board.sets[self.config.pool].endpoints) or "no endpoints yet")

    async def stop(self, grace: float = 5.0) -> None:
        await self._set_health(health_pb2.HealthCheckResponse.NOT_SERVING)
        await self.server.stop(grace)
        for t in self._tasks:
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self.cluster is not None:
            await self.cluster.stop()
        await self.board.stop()

    async def serve_until_signal(self) -> None:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self._stopping.set)
        await self.start()
        await self._stopping.wait()
        await self.stop()


def serve_epp(config: EndpointPickerConfig) -> int:
    if config.metrics_address:
        serve_metrics(config.metrics_address)

    async def main() -> None:
        await EppServer(config).serve_until_signal()

    asyncio.run(main())
    return 0
