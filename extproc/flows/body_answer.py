"""A flow for calls the gateway answers itself from the request body (file uploads, batch
creation, token counts): no upstream, so its response steps only pass through."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from extproc import messages as msg
from extproc.context import RequestContext
from extproc.gateway import Gateway

BodyHandler = Callable[[Gateway, RequestContext, bytes], Awaitable[msg.ProcessingResponse]]


class SelfAnswered:
    """A flow whose answer the gateway makes at the request-body step: nothing goes upstream, so its
    response steps only pass through. Subclasses write `request_body`."""

    def __init__(self, gw: Gateway, ctx: RequestContext) -> None:
        self.gw = gw
        self.ctx = ctx

    def response_headers(self, status: int, headers: dict[str, str]) -> msg.ProcessingResponse:
        return msg.response_headers()

    def response_body(self, chunk: bytes, end_of_stream: bool) -> msg.ProcessingResponse:
        return msg.response_body()

    def response_trailers(self, trailers: dict[str, str]) -> msg.ProcessingResponse:
        return msg.response_trailers()

    def defer(self) -> None:
        pass

    def close(self) -> None:
        pass


class BodyAnswer(SelfAnswered):
    def __init__(self, gw: Gateway, ctx: RequestContext, *, handler: BodyHandler) -> None:
        super().__init__(gw, ctx)
        self.handler = handler

    async def request_body(self, body: bytes) -> msg.ProcessingResponse:
        return await self.handler(self.gw, self.ctx, body)
