"""The floor under any Python ext_proc: a grpc.aio ExternalProcessor that does nothing but answer.

It answers every phase Modelyard's Envoy config sends (request headers, buffered request body,
response headers, buffered response body) and, like Modelyard, sets the cluster header and clears
the route cache on the body step, so the request reaches the same upstream through the same
Envoy, and switches an SSE answer's body to STREAMED (each chunk a message), as Modelyard does. No auth, no parsing, no routing, no metering: what it costs per request is what grpc.aio
and four ext_proc round trips cost, the part of `extproc_cpu_us` no gateway logic can remove.
On a stream the Envoy config runs full duplex (its metadata says so, as for the extproc: extproc/duplex.py)
it holds each headers reply until its body has come, then sends it with the body back whole (two waits).
bench/bench_gateway.py runs it beside Modelyard and reports Modelyard's CPU as a ratio to it.

    python bench/floor_extproc.py HOST:PORT CLUSTER [--loop uvloop|asyncio] [--socket PATH [--server h2|grpcio]]

With `--socket` it also listens on a Unix socket, served straight on h2 by the extproc's own server
(extproc/h2_grpc.py) or by grpc.aio: bench/floor_servers.py compares the two.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from pathlib import Path

import grpc
from envoy.config.core.v3 import base_pb2
from envoy.extensions.filters.http.ext_proc.v3 import processing_mode_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as ext_grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from contracts.envoy_names import BODIES_METADATA, CLUSTER_HEADER  # noqa: E402
from extproc.grpc_services import Services  # noqa: E402
from extproc.h2_grpc import H2GrpcServer  # noqa: E402
from extproc.messages import streamed_body  # noqa: E402
from extproc.server import settle_heap  # noqa: E402
from extproc.service import loop_factory  # noqa: E402

# Header mutations Modelyard's replies carry for a unary OpenAI call under the shipped config
# (bench/floor_replies.py: what carrying them costs Envoy and grpc, apart from building them).
_REQUEST_HEADERS_REMOVED = ["x-modelyard-cluster", "x-modelyard-tenant", "x-modelyard-task-replay",
                            "x-modelyard-callback-url"]
_REQUEST_BODY_REMOVED = ["api-key", "authorization", "x-amz-security-token", "x-api-key", "x-goog-api-key",
                         "accept-encoding", "x-modelyard-strategy", "x-modelyard-channel"]
_TASK_ID = "cd1a6eae0f1224fad91624436f9d01fa"
_RESPONSE_SET = [("x-modelyard-task-id", _TASK_ID), ("x-modelyard-model", "demo-gpt"),
                 ("x-modelyard-channel", "standard"), ("x-modelyard-strategy", "balanced"), ("x-modelyard-arm", "A")]
_RESPONSE_REMOVED = ["x-modelyard-upstream-host", "x-modelyard-upstream-attempts"]


def _set(mutation: pb.HeaderMutation, key: str, value: str) -> None:
    mutation.set_headers.add(
        header=base_pb2.HeaderValue(key=key, raw_value=value.encode()),
        append_action=base_pb2.HeaderValueOption.OVERWRITE_IF_EXISTS_OR_ADD)


def modelyard_shaped(out: dict[str | None, pb.ProcessingResponse], cluster: str, body_length: int,
                     response_side: bool) -> None:
    """Add Modelyard's own mutations to the floor's replies (request side, and the response headers')."""
    out["request_headers"].request_headers.response.header_mutation.remove_headers.extend(_REQUEST_HEADERS_REMOVED)
    body = out["request_body"].request_body.response.header_mutation
    for key, value in (("content-type", "application/json"), (":path", "/v1/chat/completions"),
                       ("content-length", str(body_length)), ("x-modelyard-task-id", _TASK_ID),
                       ("x-modelyard-tenant", "demo"), ("x-envoy-upstream-rq-timeout-ms", "60000")):
        _set(body, key, value)
    body.remove_headers.extend(_REQUEST_BODY_REMOVED)
    if response_side:
        headers = out["response_headers"].response_headers.response.header_mutation
        for key, value in [*_RESPONSE_SET, ("x-modelyard-cluster", cluster)]:
            _set(headers, key, value)
        headers.remove_headers.extend(_RESPONSE_REMOVED)


def replies(cluster: str, shape: str = "floor", body_length: int = 0) -> dict[str | None, pb.ProcessingResponse]:
    """One prebuilt reply per message kind: the floor spends nothing on building them."""
    body = pb.ProcessingResponse()
    common = body.request_body.response
    common.clear_route_cache = True
    _set(common.header_mutation, CLUSTER_HEADER, cluster)
    out: dict[str | None, pb.ProcessingResponse] = {"request_body": body}
    for kind in ("request_headers", "response_headers", "response_body", "request_trailers", "response_trailers"):
        r = pb.ProcessingResponse()
        getattr(r, kind).SetInParent()
        out[kind] = r
    stream = pb.ProcessingResponse()
    stream.response_headers.SetInParent()
    stream.mode_override.response_body_mode = processing_mode_pb2.ProcessingMode.STREAMED
    out["sse"] = stream
    if shape != "floor":
        modelyard_shaped(out, cluster, body_length, response_side=shape == "modelyard")
    return out


def is_sse(req: pb.ProcessingRequest) -> bool:
    """Response headers that announce an SSE stream (the one header look the floor pays for)."""
    return any(h.key == "content-type" and h.raw_value.startswith(b"text/event-stream")
               for h in req.response_headers.headers.headers)


def busy(seconds: float) -> None:
    """`seconds` of this thread's CPU, spent on nothing (bench/floor_work.py: the cost of work per message)."""
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        pass


class FloorProcessor(ext_grpc.ExternalProcessorServicer):
    def __init__(self, cluster: str, shape: str = "floor", body_length: int = 0, work_us: float = 0.0,
                 after_us: float = 0.0) -> None:
        self.replies = replies(cluster, shape, body_length)
        self.work_s = work_us / 1e6
        self.after_s = after_us / 1e6
        # Duplex: the request's route choice rides on its headers reply (nothing else answers before the body).
        request = pb.ProcessingResponse()
        request.CopyFrom(self.replies["request_headers"])
        request.request_headers.response.MergeFrom(self.replies["request_body"].request_body.response)
        self.duplex_headers = {"request_headers": request, "response_headers": self.replies["response_headers"]}

    async def Process(self, request_iterator: object, context: grpc.aio.ServicerContext) -> None:  # noqa: N802
        if any(k == BODIES_METADATA for k, _ in context.invocation_metadata() or ()):
            return await self._duplex(context)
        # read()/write(), as extproc/server.py does: the cheapest way grpc.aio offers.
        while (req := await context.read()) is not grpc.aio.EOF:
            kind = req.WhichOneof("request")
            if kind == "response_headers" and is_sse(req):
                kind = "sse"
            if self.work_s:
                busy(self.work_s)
            await context.write(self.replies[kind])
            if self.after_s:
                busy(self.after_s)

    async def _duplex(self, context: grpc.aio.ServicerContext) -> None:
        chunks: list[bytes] = []
        held: pb.ProcessingResponse | None = None
        while (req := await context.read()) is not grpc.aio.EOF:
            kind = req.WhichOneof("request")
            if self.work_s:
                busy(self.work_s)
            if kind in ("request_trailers", "response_trailers"):
                await context.write(self.replies[kind])
            elif kind == "request_headers" or kind == "response_headers":
                held, chunks = self.duplex_headers[kind], []
                if getattr(req, kind).end_of_stream or (kind == "response_headers" and is_sse(req)):
                    await context.write(held)
                    held = None
            elif held is None:  # a stream's chunk: back as it came
                part = getattr(req, kind)
                await context.write(streamed_body(kind, part.body, part.end_of_stream))
            else:
                part = getattr(req, kind)
                chunks.append(part.body)
                if part.end_of_stream:
                    await context.write(held)
                    await context.write(streamed_body(kind, b"".join(chunks), True))
                    held = None


async def serve(address: str, cluster: str, shape: str = "floor", body_length: int = 0, work_us: float = 0.0,
                after_us: float = 0.0, socket: str | None = None, socket_server: str = "h2") -> None:
    limit = 33 * 1024 * 1024  # the extproc's own: max_body_bytes' default and a MiB
    server = grpc.aio.server(options=[("grpc.max_receive_message_length", limit),
                                      ("grpc.max_send_message_length", limit)])
    services = Services(server)
    ext_grpc.add_ExternalProcessorServicer_to_server(
        FloorProcessor(cluster, shape, body_length, work_us, after_us), services)
    checks = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(checks, services)
    server.add_insecure_port(address)
    if socket and socket_server == "grpcio":
        server.add_insecure_port(f"unix:{socket}")
    await server.start()
    served = H2GrpcServer(services, socket, max_message=limit) if socket and socket_server == "h2" else None
    if served is not None:  # held here: the loop keeps no strong reference to a listening server
        await served.start()
    settle_heap()  # as the extproc does once it serves
    for name in ("", "envoy.service.ext_proc.v3.ExternalProcessor"):
        await checks.set(name, health_pb2.HealthCheckResponse.SERVING)
    await server.wait_for_termination()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("address")
    p.add_argument("cluster")
    p.add_argument("--loop", choices=("uvloop", "asyncio"), default="uvloop")
    p.add_argument("--replies", choices=("floor", "request-side", "modelyard"), default="floor",
                   help="bare replies, or Modelyard's own header mutations in them (bench/floor_replies.py)")
    p.add_argument("--body-length", type=int, default=0, help="the request body's length, for content-length")
    p.add_argument("--work-us", type=float, default=0.0,
                   help="busy CPU per message before each reply (bench/floor_work.py)")
    p.add_argument("--after-us", type=float, default=0.0,
                   help="busy CPU per message after each reply's write (bench/floor_work.py's a<N> levels)")
    p.add_argument("--socket", default=None, help="also listen on this Unix socket (Envoy's way in when local)")
    p.add_argument("--server", choices=("h2", "grpcio"), default="h2", help="who serves --socket")
    a = p.parse_args(argv)
    with asyncio.Runner(loop_factory=loop_factory(a.loop)) as runner:
        runner.run(serve(a.address, a.cluster, a.replies, a.body_length, a.work_us, a.after_us, a.socket, a.server))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
