"""Bodies in FULL_DUPLEX_STREAMED, spoken to a `Session` that answers buffered steps.

On the paths the Envoy config runs full duplex (controlplane.bootstrap, `extproc.bodies`), Envoy sends
a message's body right behind its headers without waiting for the headers' reply, and takes replies
in any order: a unary call then waits twice (request, response) instead of four times. This wrapper
keeps the session and its flows as they are: it answers a headers message at once only when nothing
follows it (or, on the response side, when the flow streams or skips the body); otherwise it holds
the headers reply, gathers the body, runs the session's body step on the whole of it, and sends the
headers reply with the body step's header mutations and route choice folded in, then the body back in
one streamed reply (duplex bodies are the processor's to return: Envoy keeps none of them).
The gRPC shells (extproc/server.py) pick it for a stream whose metadata says `BODIES_METADATA: duplex`.
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable

from envoy.extensions.filters.http.ext_proc.v3 import processing_mode_pb2

from contracts.errors import ClientError, ModelyardError, UpstreamError, answer_too_large
from extproc import messages as msg
from extproc.context import Interim
from extproc.session import Session

Reply = msg.ProcessingResponse | Interim
_STREAMED = processing_mode_pb2.ProcessingMode.STREAMED
_NONE = processing_mode_pb2.ProcessingMode.NONE


class DuplexSession:
    def __init__(self, session: Session, max_body_bytes: int) -> None:
        self.session = session
        self.max_body = max_body_bytes
        self._held: msg.ProcessingResponse | None = None  # a headers reply waiting for its body's end
        self._chunks: list[bytes] = []
        self._size = 0
        self._response = "buffer"  # the response body: buffer (then one reply), stream (chunk by chunk) or pass

    async def handle(self, req: msg.ProcessingRequest, more: bool = False) -> list[Reply]:
        """The replies to `req`, in order: none while a body is still coming, two when it ends. `more`: the
        stream's next message is already here (an SSE answer's chunks that came together go on together)."""
        kind = req.WhichOneof("request")
        if kind == "request_body" or kind == "response_body":
            part = getattr(req, kind)
            if kind == "response_body" and self._response == "stream":
                if more and not part.end_of_stream:
                    self._chunks.append(part.body)
                    return []
                if not self._chunks:
                    return [_as_streamed(await self._one(req), part.body, part.end_of_stream)]
                return [await self._stream_chunk(part.body, part.end_of_stream)]
            if self._held is None:  # answered already (or passed on): the body goes back as it came
                return [msg.streamed_body(kind, part.body, part.end_of_stream)]
            if self._size + len(part.body) > self.max_body:
                return [self._too_large(kind)]
            self._chunks.append(part.body)
            self._size += len(part.body)
            return await self._body_ended(kind, True) if part.end_of_stream else []
        if kind == "request_trailers":
            # Trailers end the body (its last chunk did not): its step runs first, then their reply.
            done = await self._body_ended("request_body", False) if self._held is not None else []
            return [*done, msg.ProcessingResponse(request_trailers=msg.pb.TrailersResponse())]
        if kind == "response_trailers":
            done = await self._body_ended("response_body", False) if self._held is not None else \
                [await self._stream_chunk(b"", False)] if self._chunks else []
            return [*done, await self._one(req)]
        if kind == "request_headers":
            first = await self.session.handle(req)
            if not req.request_headers.end_of_stream and _is(first, "request_headers"):
                assert isinstance(first, msg.ProcessingResponse)
                self._hold(first)
                return []
            return [] if first is None else [first]
        out = await self._one(req)
        if kind == "response_headers" and _is(out, "response_headers"):
            override = None
            if out.HasField("mode_override"):  # duplex modes are fixed for the stream: Envoy refuses a change
                override = out.mode_override.response_body_mode
                mine = msg.pb.ProcessingResponse()
                mine.CopyFrom(out)  # not the flow's own object, which it may share
                mine.ClearField("mode_override")
                out = mine
            if override == _STREAMED:
                self._response = "stream"
            elif override == _NONE or out.response_headers.response.status == msg.pb.CommonResponse.CONTINUE_AND_REPLACE:
                self._response = "pass"
            elif not req.response_headers.end_of_stream:
                self._hold(out)
                return []
        return [out]

    def close(self) -> None:
        self.session.close()

    async def _one(self, req: msg.ProcessingRequest) -> msg.ProcessingResponse:
        out = await self.session.handle(req)
        assert isinstance(out, msg.ProcessingResponse)  # only request steps wait on purpose (an Interim)
        return out

    async def _stream_chunk(self, body: bytes, end: bool) -> msg.ProcessingResponse:
        """A streamed answer's bytes (with any gathered before them) through the flow's chunk step."""
        if self._chunks:
            self._chunks.append(body)
            body, self._chunks = b"".join(self._chunks), []
        return _as_streamed(await self._one(_body_message("response_body", body, end)), body, end)

    def _hold(self, reply: msg.ProcessingResponse) -> None:
        self._held, self._chunks, self._size = reply, [], 0

    async def _body_ended(self, kind: str, end: bool) -> list[Reply]:
        """The whole body through the session's buffered body step, its answer folded into the held headers'
        (`end`: the body ends the message; else trailers follow it, as a buffered body step was told)."""
        body = b"".join(self._chunks)
        self._chunks, self._size = [], 0
        return self._fold(kind, body, end, await self.session.handle(_body_message(kind, body, end)))

    def _fold(self, kind: str, body: bytes, end: bool, out: Reply | None) -> list[Reply]:
        if isinstance(out, Interim):  # a step that waits on purpose: its timer extension now, the rest after
            return [Interim(out.message, functools.partial(self._later, kind, body, end, out.then))]
        held, self._held = self._held, None
        assert held is not None and out is not None
        if not _is(out, kind):  # an immediate answer stands for both
            return [out]
        step = getattr(out, kind).response
        if step.clear_route_cache or step.header_mutation.set_headers or step.header_mutation.remove_headers:
            mine = msg.pb.ProcessingResponse()
            mine.CopyFrom(held)  # a headers reply may be shared by every call (the session's prebuilt ones)
            held = mine
            headers = getattr(held, held.WhichOneof("response")).response
            _fold_mutation(headers.header_mutation, step.header_mutation)
            if step.clear_route_cache:
                headers.clear_route_cache = True
            if not end:  # trailers follow: the body goes chunked, and a length beside that is a malformed message
                _fold_mutation(headers.header_mutation, msg.mutation((), ["content-length"]))
        mutated = step.body_mutation.WhichOneof("mutation")
        back = msg.streamed_body(kind, step.body_mutation.body if mutated == "body" else
                                 b"" if mutated == "clear_body" else body, end)
        if out.HasField("dynamic_metadata"):
            back.dynamic_metadata.CopyFrom(out.dynamic_metadata)
        return [held, back]

    async def _later(self, kind: str, body: bytes, end: bool,
                     then: Callable[[], Awaitable[msg.ProcessingResponse | Interim]]) -> Reply:
        # The server loop writes an Interim's message and awaits this: only the last reply can come back
        # that way, so the held headers go out first with the Interim's own write below.
        folded = self._fold(kind, body, end, await then())
        if len(folded) == 2:
            return Interim(folded[0], _ready(folded[1]))
        return folded[0]

    def _too_large(self, kind: str) -> msg.ProcessingResponse:
        """A body past the gateway's limit: Envoy buffers none in duplex, so the limit is ours to keep."""
        self._held, self._chunks, self._size = None, [], 0
        e: ModelyardError
        if kind == "request_body":
            e = ClientError(f"request body is larger than the gateway accepts ({self.max_body} bytes)", status=413)
        else:
            e = UpstreamError(answer_too_large(self.max_body))
        return self.session.error(e)


def _body_message(kind: str, body: bytes, end: bool) -> msg.ProcessingRequest:
    """The body message a buffered (or STREAMED) step is written for: `body` whole, `end` as Envoy would say."""
    req = msg.ProcessingRequest()
    part = getattr(req, kind)
    part.body = body
    part.end_of_stream = end
    return req


def _is(reply: msg.ProcessingResponse | Interim | None, kind: str) -> bool:
    return isinstance(reply, msg.ProcessingResponse) and reply.WhichOneof("response") == kind


def _as_streamed(out: msg.ProcessingResponse, body: bytes, end: bool) -> msg.ProcessingResponse:
    """A STREAMED step's reply as a duplex one: its body (or the chunk unchanged) back, in place."""
    if not _is(out, "response_body"):
        return out
    m = out.response_body.response.body_mutation
    mutated = m.WhichOneof("mutation")
    return msg.streamed_body("response_body", m.body if mutated == "body" else
                             b"" if mutated == "clear_body" else body, end)


def _fold_mutation(into: msg.pb.HeaderMutation, later: msg.pb.HeaderMutation) -> None:
    """`later`'s header changes applied after `into`'s, as two replies in turn would have been. Envoy applies
    one mutation's removals first, then its sets in order: appended to `into`'s, `later`'s sets win, and
    `into`'s removals still go before them. Only a header `later` removes must first leave `into`'s sets."""
    if later.remove_headers and into.set_headers:
        removed = set(later.remove_headers)
        keep = [h for h in into.set_headers if h.header.key not in removed]
        if len(keep) < len(into.set_headers):
            del into.set_headers[:]
            into.set_headers.extend(keep)
    into.MergeFrom(later)  # appends `later`'s sets and removals in one call (no copy per header in Python)


def _ready(reply: msg.ProcessingResponse) -> Callable[[], Awaitable[msg.ProcessingResponse]]:
    async def then() -> msg.ProcessingResponse:
        return reply
    return then
