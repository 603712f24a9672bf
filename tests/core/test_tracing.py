"""Tracing on the sans-I/O session: the spans one request makes, driven with plain ext_proc messages.

The spans go to the OpenTelemetry SDK's own in-memory exporter (a real exporter of the SDK, the
one its docs name for tests); the OTLP wire path through a real Envoy is tests/e2e/test_tracing.py.
"""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest
import yaml
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from contracts.config import TracingConfig, parse_config
from extproc.gateway import Gateway
from extproc.service import build_tracing
from extproc.session import Session
from extproc.telemetry.tracing import Tracing
from ratelimit import Limiter
from tests.core.session_driver import ROUTES, body_msg, chat_headers, headers_msg, set_headers
from tests.stack_config import without_watermarks

ROOT = Path(__file__).resolve().parents[2]
CALLER_TRACE = "0af7651916cd43dd8448eb211c80319c"
CALLER_SPAN = "b7ad6b7169203331"
TRACEPARENT = f"00-{CALLER_TRACE}-{CALLER_SPAN}-01"


def _config(**extproc: object) -> dict:
    data = without_watermarks(yaml.safe_load((ROOT / "modelyard.yaml").read_text()))
    data["extproc"].update(extproc)
    return data


@pytest.fixture
def traced() -> tuple[Gateway, InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    tracing = Tracing(TracingConfig(export_delay_ms=10), exporter=exporter)
    cfg = parse_config(_config())
    return Gateway.build(cfg, limiter=Limiter(cfg.ratelimit), tracing=tracing), exporter


def _spans(gw: Gateway, exporter: InMemorySpanExporter) -> dict[str, ReadableSpan]:
    assert gw.tracing is not None
    gw.tracing.provider.force_flush()
    return {s.name: s for s in exporter.get_finished_spans()}


async def _chat(gw: Gateway, headers: dict[str, str], request: dict, upstream: dict) -> dict[str, str]:
    """One non-streamed chat request; the headers the session set on the upstream request."""
    s = Session(gw, ROUTES)
    await s.handle(headers_msg(headers))
    r = await s.handle(body_msg(orjson.dumps(request)))
    sent = set_headers(r.request_body.response.header_mutation)
    await s.handle(headers_msg({":status": "200", "content-type": "application/json"}, response=True))
    await s.handle(body_msg(orjson.dumps(upstream), response=True))
    s.close()
    return sent


OPENAI_REPLY = {"id": "x", "object": "chat.completion", "created": 1, "model": "gpt-upstream-2025",
                "choices": [{"index": 0, "message": {"role": "assistant", "content": "yo"}, "finish_reason": "stop"}],
                "usage": {"prompt_tokens": 7, "completion_tokens": 3, "total_tokens": 10}}


async def test_request_span_has_genai_attributes_and_children(traced) -> None:
    gw, exporter = traced
    sent = await _chat(gw, {**chat_headers(), "traceparent": TRACEPARENT},
                       {"model": "demo-gpt", "messages": [{"role": "user", "content": "hi"}]}, OPENAI_REPLY)
    spans = _spans(gw, exporter)
    root = spans["chat demo-gpt"]
    a = root.attributes
    assert a["gen_ai.operation.name"] == "chat"
    assert a["gen_ai.request.model"] == "demo-gpt"
    assert a["gen_ai.response.model"] == "gpt-upstream-2025"  # what the upstream reported
    assert (a["gen_ai.usage.input_tokens"], a["gen_ai.usage.output_tokens"]) == (7, 3)
    assert a["gen_ai.provider.name"] == a["gen_ai.system"] == "openai"
    assert a["modelyard.cluster"] == "demo-openai" and a["http.response.status_code"] == 200
    # The caller's trace continues here, and the upstream's parent is our request span.
    assert format(root.context.trace_id, "032x") == CALLER_TRACE
    assert root.parent is not None and format(root.parent.span_id, "016x") == CALLER_SPAN
    assert sent["traceparent"] == f"00-{CALLER_TRACE}-{root.context.span_id:016x}-01"
    for child in ("routing", "admission", "translate request", "translate response"):
        assert spans[child].parent.span_id == root.context.span_id, child
        assert spans[child].context.trace_id == root.context.trace_id
    assert spans["translate request"].attributes["modelyard.translation.passthrough"] is True
    assert spans["admission"].attributes["modelyard.ratelimit.allowed"] is True


async def test_cross_protocol_request_is_a_translation(traced) -> None:
    gw, exporter = traced
    headers = {":method": "POST", ":path": "/v1/messages", "content-type": "application/json",
               "x-api-key": "sk-modelyard-demo"}
    await _chat(gw, headers, {"model": "demo-gpt", "max_tokens": 50, "messages": [{"role": "user", "content": "hi"}]},
                OPENAI_REPLY)
    spans = _spans(gw, exporter)
    root = spans["chat demo-gpt"]
    assert root.attributes["modelyard.client_protocol"] == "anthropic"
    assert root.attributes["gen_ai.provider.name"] == "openai"
    assert root.parent is None  # no traceparent from the caller: the trace starts here
    t = spans["translate response"].attributes
    assert (t["modelyard.translation.from"], t["modelyard.translation.to"]) == ("anthropic", "openai")
    assert t["modelyard.translation.passthrough"] is False


async def test_refused_request_span_says_why(traced) -> None:
    gw, exporter = traced
    s = Session(gw, ROUTES)
    r = await s.handle(headers_msg(chat_headers(key="sk-wrong")))
    assert r.immediate_response.status.code == 401
    s.close()
    (span,) = _spans(gw, exporter).values()
    assert span.attributes["http.response.status_code"] == 401
    assert span.attributes["error.type"] == "authentication_error"
    assert "sk-wrong" not in str(span.attributes)  # keys never reach a span


async def test_unsampled_caller_keeps_its_trace_id_upstream(traced) -> None:
    gw, exporter = traced
    sent = await _chat(gw, {**chat_headers(), "traceparent": f"00-{CALLER_TRACE}-{CALLER_SPAN}-00"},
                       {"model": "demo-gpt", "messages": [{"role": "user", "content": "hi"}]}, OPENAI_REPLY)
    assert _spans(gw, exporter) == {}  # the caller said not sampled: nothing is recorded
    assert sent["traceparent"].startswith(f"00-{CALLER_TRACE}-") and sent["traceparent"].endswith("-00")


async def test_tracing_off_leaves_no_trace_on_the_request() -> None:
    cfg = parse_config(_config())
    assert cfg.extproc.tracing is None and build_tracing(cfg) is None
    gw = Gateway.build(cfg)
    s = Session(gw, ROUTES)
    await s.handle(headers_msg({**chat_headers(), "traceparent": TRACEPARENT}))
    assert s.ctx is not None and s.ctx.trace is None
    r = await s.handle(body_msg(orjson.dumps({"model": "demo-gpt", "messages": [{"role": "user", "content": "hi"}]})))
    # Off: we neither add nor rewrite trace context (the caller's header travels on untouched).
    assert "traceparent" not in set_headers(r.request_body.response.header_mutation)
    s.close()


def test_tracing_config_is_checked() -> None:
    with pytest.raises(Exception, match="sample_ratio"):
        parse_config(_config(tracing={"sample_ratio": 2}))
    cfg = parse_config(_config(tracing={"endpoint": "http://127.0.0.1:4318/v1/traces"}))
    assert cfg.extproc.tracing is not None and cfg.extproc.tracing.protocol == "http/protobuf"


async def test_translation_hop_span_is_a_child_of_the_request(traced) -> None:
    """Envoy failed over through a translation hop: the hop's stream carries the traceparent the
    request sent upstream, so its span joins the same trace and the peer sees the hop as parent."""
    gw, exporter = traced
    request_span = "1111111111111111"
    s = Session(gw, ROUTES, xlate="openai~demo-anthropic")
    await s.handle(headers_msg({":method": "POST", ":path": "/v1/chat/completions", "content-type": "application/json",
                                "traceparent": f"00-{CALLER_TRACE}-{request_span}-01"}))
    r = await s.handle(body_msg(orjson.dumps({"model": "demo-gpt", "messages": [{"role": "user", "content": "hi"}]})))
    sent = set_headers(r.request_body.response.header_mutation)
    s.close()
    spans = _spans(gw, exporter)
    hop = spans["translation hop openai~demo-anthropic"]
    assert format(hop.parent.span_id, "016x") == request_span and format(hop.context.trace_id, "032x") == CALLER_TRACE
    assert sent["traceparent"] == f"00-{CALLER_TRACE}-{hop.context.span_id:016x}-01"
    t = spans["translate request"].attributes
    assert (t["modelyard.translation.from"], t["modelyard.translation.to"]) == ("openai", "anthropic")


_WITHOUT_OTEL = """
import asyncio, importlib.abc, sys

class NoOpenTelemetry(importlib.abc.MetaPathFinder):  # as if the tracing extra were not installed
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] == "opentelemetry":
            raise ImportError(f"No module named {name!r}")
        return None

sys.meta_path.insert(0, NoOpenTelemetry())
import orjson
from contracts.config import parse_config
from extproc.gateway import Gateway
from extproc.service import build_tracing
from extproc.session import Session
from contracts.errors import ConfigError
from tests.core.session_driver import ROUTES, body_msg, chat_headers, headers_msg
from tests.stack_config import ROOT, without_watermarks
import yaml

def _config(**extproc):
    data = without_watermarks(yaml.safe_load((ROOT / "modelyard.yaml").read_text()))
    data["extproc"].update(extproc)
    return data

async def one():
    s = Session(Gateway.build(parse_config(_config())), ROUTES)
    await s.handle(headers_msg(chat_headers()))
    r = await s.handle(body_msg(orjson.dumps({"model": "demo-gpt", "messages": [{"role": "user", "content": "hi"}]})))
    s.close()
    return r.WhichOneof("response")

assert asyncio.run(one()) == "request_body"
assert not [m for m in sys.modules if m.startswith("opentelemetry") or m == "extproc.telemetry.tracing"]
try:
    build_tracing(parse_config(_config(tracing={})))
except ConfigError as e:
    print("refused:", e)
"""


def test_without_the_extra_tracing_off_works_and_on_is_refused() -> None:
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-c", _WITHOUT_OTEL], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "refused: extproc.tracing needs the tracing extra" in out.stdout
