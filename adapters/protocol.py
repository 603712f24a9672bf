"""What every chat protocol module (`adapters.openai`, `adapters.anthropic`, `adapters.gemini`)
provides; mypy checks each module against `ChatProtocol` where `registry.PROTOCOLS` lists it."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

from adapters.internal import ChatRequest, ChatResponse, RenderOptions, StreamEvent, UpstreamRequest

__all__ = ["ChatProtocol", "StreamDecoder", "StreamEncoder", "StreamEncoderFactory"]


class StreamDecoder(Protocol):
    """Upstream SSE bytes in, internal stream events out."""

    def feed(self, chunk: bytes) -> list[StreamEvent]: ...

    def close(self) -> list[StreamEvent]: ...


class StreamEncoder(Protocol):
    """Internal stream events in, client SSE bytes out."""

    def encode(self, events: list[StreamEvent]) -> bytes: ...


class StreamEncoderFactory(Protocol):
    def __call__(self, *, model: str, request: ChatRequest | None = None) -> StreamEncoder: ...


class ChatProtocol(Protocol):
    # Read-only members, so a module's constants and classes satisfy them.
    @property
    def CLIENT_AUTH_HEADERS(self) -> tuple[str, ...]: ...

    @property
    def StreamDecoder(self) -> type[StreamDecoder]: ...

    @property
    def StreamEncoder(self) -> StreamEncoderFactory: ...

    def parse_request(self, body: bytes, *, path_model: str | None = None,
                      stream_hint: bool = False) -> ChatRequest: ...

    # The query string's rules, before the body is parsed (Gemini streams need `alt=sse`).
    def check_query(self, query: Mapping[str, str], *, stream_hint: bool) -> None: ...

    # A same-protocol upstream's body: the client's bytes with the upstream model name, and True
    # when stream usage was switched on that the client did not ask for (stripped on the way back).
    def passthrough_body(self, body: bytes, req: ChatRequest, *, upstream_model: str) -> tuple[bytes, bool]: ...

    def request_target(self, req: ChatRequest, *, upstream_model: str,
                       credential: str | None) -> tuple[str, dict[str, str]]: ...

    def render_request(self, req: ChatRequest, *, upstream_model: str, credential: str | None,
                       options: RenderOptions | None = None) -> UpstreamRequest: ...

    # The controls set on `req` this protocol cannot express (adapters/controls.py): render_request
    # refuses them (400); the flow first drops those the deployment's drop_params allows.
    def unsupported_controls(self, req: ChatRequest, options: RenderOptions | None = None) -> tuple[str, ...]: ...

    def parse_response(self, body: bytes) -> ChatResponse: ...

    # `request`: what the client asked, for protocols whose answer echoes its settings (Responses).
    def render_response(self, resp: ChatResponse, *, model: str, request: ChatRequest | None = None) -> bytes: ...

    def parse_error(self, status: int, body: bytes) -> str: ...

    def render_error(self, status: int, message: str, type: str | None = None) -> bytes: ...

    def client_api_key(self, headers: Mapping[str, str], query: Mapping[str, str]) -> str | None: ...
