"""OpenTelemetry tracing: one span per request with the GenAI semantic conventions, child spans for
routing, admission, batching and translation, W3C trace context from the caller and to the upstream.

Optional and off by default (`extproc.tracing`). Only the composition root imports this module, and
only when tracing is configured: when it is off, `RequestContext.trace` stays None and the request
path holds no tracer, span or OpenTelemetry import. Spans leave through the SDK's batch processor,
whose exporter runs in its own thread, so the event loop never waits on the collector.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter
from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased
from opentelemetry.trace import Span, SpanKind, Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from contracts.config import TracingConfig
from contracts.errors import ModelyardError

# gen_ai.provider.name (and the older gen_ai.system) for each upstream protocol: the semconv's
# well-known values where there is one.
PROVIDER_NAMES = {"openai": "openai", "responses": "openai", "anthropic": "anthropic", "gemini": "gcp.gemini",
                  "kserve-grpc": "kserve", "kserve-rest": "kserve"}
TRACE_HEADERS = ("traceparent", "tracestate")

_PROPAGATOR = TraceContextTextMapPropagator()


def _exporter(cfg: TracingConfig) -> SpanExporter:
    if cfg.protocol == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as GrpcExporter

        return GrpcExporter(endpoint=cfg.endpoint, insecure=cfg.endpoint.startswith("http://"),
                            timeout=cfg.export_timeout_s)
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as HttpExporter

    return HttpExporter(endpoint=cfg.endpoint, timeout=cfg.export_timeout_s)


class Tracing:
    """The process's tracer provider (not the global one: tests run several in one process)."""

    def __init__(self, cfg: TracingConfig, exporter: SpanExporter | None = None) -> None:
        self.config = cfg
        self.provider = TracerProvider(resource=Resource.create({"service.name": cfg.service_name}),
                                       sampler=ParentBased(TraceIdRatioBased(cfg.sample_ratio)))
        self.provider.add_span_processor(BatchSpanProcessor(exporter or _exporter(cfg),
                                                            schedule_delay_millis=cfg.export_delay_ms))
        self.tracer = self.provider.get_tracer("modelyard")

    def start_request(self, headers: Mapping[str, str], *, protocol: str, operation: str,
                      hop: str | None = None) -> RequestTrace:
        """The request's span, a child of the caller's `traceparent` when it sent a valid one."""
        parent = _PROPAGATOR.extract({k: headers[k] for k in TRACE_HEADERS if k in headers})
        name = f"translation hop {hop}" if hop else operation
        attributes = {"gen_ai.operation.name": operation, "modelyard.client_protocol": protocol}
        if hop:
            attributes["modelyard.hop"] = hop
        span = self.tracer.start_span(name, context=parent, kind=SpanKind.SERVER if hop is None else SpanKind.INTERNAL,
                                      attributes=attributes)
        return RequestTrace(self.tracer, span, operation)

    def shutdown(self) -> None:
        """Export what is queued and stop the exporter thread (blocking: call it from a thread)."""
        self.provider.shutdown()


class RequestTrace:
    """One request's span and its children; the flows write to it, the session ends it."""

    __slots__ = ("tracer", "span", "operation", "recording", "_context", "_status", "_ended")

    def __init__(self, tracer: trace.Tracer, span: Span, operation: str) -> None:
        self.tracer = tracer
        self.span = span
        self.operation = operation
        # Not sampled: no children, no attributes; only the trace context still goes upstream.
        self.recording = span.is_recording()
        self._context: Context = trace.set_span_in_context(span)
        self._status = 0
        self._ended = False

    @contextmanager
    def child(self, name: str, attributes: dict[str, Any] | None = None) -> Iterator[Span]:
        """A child span around a step; a ModelyardError raised inside marks it failed."""
        span = self.tracer.start_span(name, context=self._context, attributes=attributes)
        try:
            yield span
        except ModelyardError as e:
            span.set_status(Status(StatusCode.ERROR, e.type))
            span.set_attribute("error.type", e.type)
            raise
        except BaseException as e:
            span.set_status(Status(StatusCode.ERROR, type(e).__name__))
            raise
        finally:
            span.end()

    def record_since(self, name: str, started_monotonic: float, attributes: dict[str, Any] | None = None) -> None:
        """A child span that began at `started_monotonic` (a stream's first chunk) and ends now."""
        if not self.recording:
            return
        now_ns = time.time_ns()
        start_ns = now_ns - int((time.monotonic() - started_monotonic) * 1e9)
        span = self.tracer.start_span(name, context=self._context, start_time=start_ns, attributes=attributes)
        span.end(end_time=now_ns)

    def routed(self, request_model: str, model: str, cluster: str, upstream_protocol: str, channel: str,
               strategy: str) -> None:
        """What routing decided: the GenAI request attributes and the span's final name."""
        if not self.recording:
            return
        provider = PROVIDER_NAMES.get(upstream_protocol, upstream_protocol)
        self.span.update_name(f"{self.operation} {request_model}")
        self.span.set_attributes({"gen_ai.request.model": request_model, "gen_ai.provider.name": provider,
                                  "gen_ai.system": provider, "modelyard.model": model, "modelyard.cluster": cluster,
                                  "modelyard.channel": channel, "modelyard.strategy": strategy})

    def outcome(self, status: int, *, cluster: str, tenant: str, input_tokens: int | None,
                output_tokens: int | None, response_model: str | None) -> None:
        """What the caller got, as metered: status, usage, the deployment that answered."""
        self._status = status
        if not self.recording:
            return
        attrs: dict[str, Any] = {"http.response.status_code": status, "modelyard.cluster": cluster,
                                 "modelyard.tenant": tenant}
        if response_model:
            attrs["gen_ai.response.model"] = response_model
        if input_tokens is not None:
            attrs["gen_ai.usage.input_tokens"] = input_tokens
        if output_tokens is not None:
            attrs["gen_ai.usage.output_tokens"] = output_tokens
        self.span.set_attributes(attrs)

    def failed(self, e: ModelyardError) -> None:
        """The gateway answered with an error of its own (never a message with secrets: e.type)."""
        self._status = e.status
        self.span.set_attributes({"http.response.status_code": e.status, "error.type": e.type})

    def upstream_headers(self) -> list[tuple[str, str]]:
        """`traceparent` (and `tracestate`) for the upstream: the caller's trace, our span as parent."""
        carrier: dict[str, str] = {}
        _PROPAGATOR.inject(carrier, context=self._context)
        return list(carrier.items())

    def end(self) -> None:
        if self._ended:
            return
        self._ended = True
        if self._status >= 500:  # a caller's 4xx is not the server's error (semconv)
            self.span.set_status(Status(StatusCode.ERROR))
        self.span.end()
