"""The floor under any Python ext_proc: a grpc.aio ExternalProcessor that does nothing but answer.

It answers every phase Modelyard's Envoy config sends (request headers, buffered request body,
response headers, buffered response body) and, like Modelyard, sets the cluster header and clears
the route cache on the body step, so the request reaches the same upstream through the same
Envoy. No auth, no parsing, no routing, no metering: what it costs per request is what grpc.aio
and four ext_proc round trips cost, the part of `extproc_cpu_us` no gateway logic can remove.
bench/bench_gateway.py runs it beside Modelyard and reports Modelyard's CPU as a ratio to it.

    python bench/floor_extproc.py HOST:PORT CLUSTER [--loop uvloop|asyncio]
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path

import grpc
from envoy.config.core.v3 import base_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as ext_grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from contracts.envoy_names import CLUSTER_HEADER  # noqa: E402
from extproc.service import loop_factory  # noqa: E402


def replies(cluster: str) -> dict[str | None, pb.ProcessingResponse]:
    """One prebuilt reply per message kind: the floor spends nothing on building them."""
    body = pb.ProcessingResponse()
    common = body.request_body.response
    common.clear_route_cache = True
    common.header_mutation.set_headers.add(
        header=base_pb2.HeaderValue(key=CLUSTER_HEADER, raw_value=cluster.encode()),
        append_action=base_pb2.HeaderValueOption.OVERWRITE_IF_EXISTS_OR_ADD)
    out: dict[str | None, pb.ProcessingResponse] = {"request_body": body}
    for kind in ("request_headers", "response_headers", "response_body", "response_trailers"):
        r = pb.ProcessingResponse()
        getattr(r, kind).SetInParent()
        out[kind] = r
    return out


class FloorProcessor(ext_grpc.ExternalProcessorServicer):
    def __init__(self, cluster: str) -> None:
        self.replies = replies(cluster)

    async def Process(self, request_iterator: object, context: grpc.aio.ServicerContext) -> None:  # noqa: N802
        # read()/write(), as extproc/server.py does: the cheapest way grpc.aio offers.
        while (req := await context.read()) is not grpc.aio.EOF:
            await context.write(self.replies[req.WhichOneof("request")])


async def serve(address: str, cluster: str) -> None:
    server = grpc.aio.server()
    ext_grpc.add_ExternalProcessorServicer_to_server(FloorProcessor(cluster), server)
    checks = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(checks, server)
    server.add_insecure_port(address)
    await server.start()
    for name in ("", "envoy.service.ext_proc.v3.ExternalProcessor"):
        await checks.set(name, health_pb2.HealthCheckResponse.SERVING)
    await server.wait_for_termination()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("address")
    p.add_argument("cluster")
    p.add_argument("--loop", choices=("uvloop", "asyncio"), default="uvloop")
    a = p.parse_args(argv)
    with asyncio.Runner(loop_factory=loop_factory(a.loop)) as runner:
        runner.run(serve(a.address, a.cluster))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
