"""Tracing through a real Envoy: the spans arrive over OTLP at an in-process receiver that decodes
the protobuf (opentelemetry-proto), and the upstream sees the caller's trace with our span as parent.

Both OTLP transports: HTTP (an aiohttp receiver) and gRPC (a grpc server of the collector's
TraceService). Clients are the real OpenAI and Anthropic SDKs.
"""

from __future__ import annotations

import gzip
import threading
import time
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path
from typing import Any

import anthropic
import grpc
import httpx
import openai
import pytest
from aiohttp import web
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc
from opentelemetry.proto.common.v1.common_pb2 import AnyValue

from devstack.demo import openai_server
from tests.conftest import DEMO_KEY
from tests.stack_config import small_config, start_stack
from tests.threaded_app import ThreadedApp
from tests.vision_stack import classify_form, vision_stack

pytestmark = pytest.mark.e2e

CALLER_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
CALLER_SPAN = "00f067aa0ba902b7"


def _value(v: AnyValue) -> Any:
    kind = v.WhichOneof("value")
    return getattr(v, kind) if kind else None


class Received:
    """Spans decoded from OTLP export requests, by name; thread-safe (receivers run in threads)."""

    def __init__(self) -> None:
        self.spans: list[dict[str, Any]] = []
        self.lock = threading.Lock()

    def add(self, body: bytes) -> None:
        req = trace_service_pb2.ExportTraceServiceRequest.FromString(body)
        with self.lock:
            for rs in req.resource_spans:
                resource = {a.key: _value(a.value) for a in rs.resource.attributes}
                for ss in rs.scope_spans:
                    for s in ss.spans:
                        self.spans.append({"name": s.name, "trace_id": s.trace_id.hex(), "span_id": s.span_id.hex(),
                                           "parent": s.parent_span_id.hex(), "kind": s.kind,
                                           "attributes": {a.key: _value(a.value) for a in s.attributes},
                                           "resource": resource})

    def wait_for(self, names: set[str], timeout: float = 30.0) -> list[dict[str, Any]]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self.lock:
                if names <= {s["name"] for s in self.spans}:
                    return list(self.spans)
            time.sleep(0.1)
        raise AssertionError(f"spans {names} not received; got {[s['name'] for s in self.spans]}")


def recording_upstream(seen: list[dict[str, str]]) -> web.Application:
    """The demo OpenAI server, remembering each request's headers."""
    @web.middleware
    async def record(request: web.Request, handler: Any) -> web.StreamResponse:
        if request.method == "POST":
            seen.append({k.lower(): v for k, v in request.headers.items()})
        return await handler(request)

    app = openai_server.make_app(name="traced")
    app.middlewares.append(record)
    return app


def http_receiver(received: Received) -> web.Application:
    async def traces(request: web.Request) -> web.Response:
        body = await request.read()
        if request.headers.get("content-encoding") == "gzip":
            body = gzip.decompress(body)
        received.add(body)
        return web.Response(body=trace_service_pb2.ExportTraceServiceResponse().SerializeToString(),
                            content_type="application/x-protobuf")

    app = web.Application()
    app.router.add_post("/v1/traces", traces)
    return app


class GrpcReceiver(trace_service_pb2_grpc.TraceServiceServicer):
    def __init__(self, received: Received) -> None:
        self.received = received

    def Export(self, request: Any, context: Any) -> Any:  # noqa: N802
        self.received.add(request.SerializeToString())
        return trace_service_pb2.ExportTraceServiceResponse()


@pytest.fixture(params=["http/protobuf", "grpc"])
def otlp(request: pytest.FixtureRequest) -> Iterator[tuple[dict[str, Any], Received]]:
    """An OTLP receiver for one transport: (the extproc.tracing settings that reach it, what it got)."""
    received = Received()
    settings: dict[str, Any] = {"protocol": request.param, "export_delay_ms": 100, "service_name": "modelyard-test"}
    if request.param == "grpc":
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
        trace_service_pb2_grpc.add_TraceServiceServicer_to_server(GrpcReceiver(received), server)
        port = server.add_insecure_port("127.0.0.1:0")
        server.start()
        try:
            yield {**settings, "endpoint": f"http://127.0.0.1:{port}"}, received
        finally:
            server.stop(None)
    else:
        with ThreadedApp(http_receiver(received)) as app:
            yield {**settings, "endpoint": f"http://127.0.0.1:{app.port}/v1/traces"}, received


def test_spans_reach_the_collector_and_the_trace_reaches_the_upstream(tmp_path: Path, otlp) -> None:
    settings, received = otlp
    seen: list[dict[str, str]] = []
    with ThreadedApp(recording_upstream(seen)) as upstream:
        data = small_config()
        data["models"][0]["deployments"][0]["endpoints"] = [f"127.0.0.1:{upstream.port}"]
        data["models"][0]["deployments"][0].pop("warmup", None)  # the upstream sees only the callers' requests
        data["extproc"]["tracing"] = settings
        data["extproc"].pop("metering_db", None)
        with start_stack(tmp_path, data, demos=False) as stack:
            oa = openai.OpenAI(base_url=f"{stack.url}/v1", api_key=DEMO_KEY, max_retries=0, timeout=30)
            reply = oa.chat.completions.create(
                model="demo-gpt", messages=[{"role": "user", "content": "trace me"}],
                extra_headers={"traceparent": f"00-{CALLER_TRACE}-{CALLER_SPAN}-01"})
            assert reply.choices[0].message.content
            # A second caller, another protocol, streamed, and no trace context of its own.
            an = anthropic.Anthropic(base_url=stack.url, api_key=DEMO_KEY, max_retries=0, timeout=30)
            with an.messages.stream(model="demo-gpt", max_tokens=64,
                                    messages=[{"role": "user", "content": "trace my stream"}]) as s:
                text = "".join(s.text_stream)
            assert text
            spans = received.wait_for({"chat demo-gpt", "routing", "translate request", "translate response"})
            while len([s for s in spans if s["name"] == "chat demo-gpt"]) < 2:
                spans = received.wait_for({"chat demo-gpt"})

    roots = [s for s in spans if s["name"] == "chat demo-gpt"]
    first = next(s for s in roots if s["trace_id"] == CALLER_TRACE)
    second = next(s for s in roots if s is not first)
    # The caller's trace id, its span as our parent; the upstream's parent is our request span.
    assert first["parent"] == CALLER_SPAN
    assert seen[0]["traceparent"] == f"00-{CALLER_TRACE}-{first['span_id']}-01"
    assert second["parent"] == "" and second["trace_id"] != CALLER_TRACE
    version, trace_id, parent, flags = seen[1]["traceparent"].split("-")
    assert (version, trace_id, parent) == ("00", second["trace_id"], second["span_id"])
    assert int(flags, 16) & 1  # sampled (the SDK may also set W3C level 2's random-trace-id bit)
    assert first["resource"]["service.name"] == "modelyard-test"

    a = first["attributes"]
    assert a["gen_ai.operation.name"] == "chat"
    assert a["gen_ai.request.model"] == a["gen_ai.response.model"] == "demo-gpt"
    assert a["gen_ai.provider.name"] == a["gen_ai.system"] == "openai"
    assert a["gen_ai.usage.input_tokens"] > 0 and a["gen_ai.usage.output_tokens"] > 0
    assert a["http.response.status_code"] == 200 and a["modelyard.tenant"] == "demo"
    b = second["attributes"]
    assert b["modelyard.client_protocol"] == "anthropic"
    assert b["gen_ai.usage.input_tokens"] > 0 and b["gen_ai.usage.output_tokens"] > 0

    children = {(s["trace_id"], s["name"]): s for s in spans if s["name"] != "chat demo-gpt"}
    for root in (first, second):
        for name in ("routing", "translate request", "translate response"):
            assert children[(root["trace_id"], name)]["parent"] == root["span_id"], name
    streamed = children[(second["trace_id"], "translate response")]["attributes"]
    assert (streamed["modelyard.translation.from"], streamed["modelyard.translation.to"]) == ("anthropic", "openai")
    # No caller or provider credential in any exported attribute.
    assert DEMO_KEY not in repr(spans)


def test_batched_image_requests_have_batching_spans(tmp_path: Path) -> None:
    received = Received()
    batched = {"enabled": True, "max_delay_ms": 1000, "min_size": 3, "max_size": 16}
    wants = [["red"], ["green"], ["blue"]]
    with ThreadedApp(http_receiver(received)) as rx:
        tracing = {"endpoint": f"http://127.0.0.1:{rx.port}/v1/traces", "export_delay_ms": 100}
        with vision_stack(tmp_path, {"colors-batched": batched}, extproc={"tracing": tracing}) as stack:
            def classify(colours: list[str]) -> httpx.Response:
                body, ctype = classify_form("colors-batched", colours)
                return httpx.post(f"{stack.url}/v1/images/classify", content=body, timeout=30,
                                  headers={"authorization": f"Bearer {DEMO_KEY}", "content-type": ctype})

            with futures.ThreadPoolExecutor(len(wants)) as pool:  # together: one batch of three
                replies = list(pool.map(classify, wants))
            assert [r.status_code for r in replies] == [200] * 3, [r.text for r in replies]
            name = "image-classification colors-batched"
            spans = received.wait_for({name, "batching"})
            deadline = time.monotonic() + 30
            while len([s for s in spans if s["name"] in (name, "batching")]) < 6 and time.monotonic() < deadline:
                spans = received.wait_for({name})
    roots = {s["span_id"]: s for s in spans if s["name"] == name}
    assert len(roots) == 3
    for root in roots.values():
        a = root["attributes"]
        assert a["gen_ai.operation.name"] == "image-classification" and a["gen_ai.request.model"] == "colors-batched"
        assert a["gen_ai.provider.name"] == "kserve" and a["http.response.status_code"] == 200
    batching = [s for s in spans if s["name"] == "batching"]
    assert sorted(s["parent"] for s in batching) == sorted(roots)  # one per request, under its own span
    roles = sorted(s["attributes"]["modelyard.batch.role"] for s in batching)
    # Usually one batch of three (leader, result, result); a slow machine may split it past the window.
    assert roles.count("leader") >= 1 and roles.count("result") >= 1 and set(roles) <= {"leader", "result"}, roles
    # A leader built the batch's tensor and translated the upstream's reply: both under its own span.
    for lead in (s for s in batching if s["attributes"]["modelyard.batch.role"] == "leader"):
        steps = {s["name"] for s in spans if s["parent"] == lead["parent"]}
        assert {"routing", "batching", "translate request", "translate response"} <= steps, steps


def test_embeddings_are_traced(tmp_path: Path) -> None:
    """An embeddings request has its own operation span (GenAI `embeddings`), its steps as children,
    usage on the span, and the upstream gets the trace."""
    received = Received()
    seen: list[dict[str, str]] = []
    with ThreadedApp(http_receiver(received)) as collector, ThreadedApp(recording_upstream(seen)) as upstream:
        data = small_config()
        data["models"] = [{"name": "demo-embed", "task_types": ["embedding"],
                           "deployments": [{"cluster": "traced-embed", "protocol": "openai",
                                            "endpoints": [f"127.0.0.1:{upstream.port}"]}]}]
        data["extproc"]["tracing"] = {"protocol": "http/protobuf", "export_delay_ms": 100,
                                      "endpoint": f"http://127.0.0.1:{collector.port}/v1/traces"}
        data["extproc"].pop("metering_db", None)
        with start_stack(tmp_path, data, demos=False) as stack:
            oa = openai.OpenAI(base_url=f"{stack.url}/v1", api_key=DEMO_KEY, max_retries=0, timeout=30)
            out = oa.embeddings.create(model="demo-embed", input=["trace these words", "and these"])
            assert len(out.data) == 2
            spans = received.wait_for({"embeddings demo-embed", "routing", "translate request", "translate response"})
    root = next(s for s in spans if s["name"] == "embeddings demo-embed")
    a = root["attributes"]
    assert a["gen_ai.operation.name"] == "embeddings" and a["gen_ai.request.model"] == "demo-embed"
    assert a["gen_ai.usage.input_tokens"] == out.usage.prompt_tokens and a["http.response.status_code"] == 200
    for name in ("routing", "translate request", "translate response"):
        assert next(s for s in spans if s["name"] == name)["parent"] == root["span_id"], name
    assert seen[-1]["traceparent"].split("-")[1:3] == [root["trace_id"], root["span_id"]]
    assert DEMO_KEY not in repr(spans)
