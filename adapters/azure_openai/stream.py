"""Azure OpenAI streams: OpenAI's chunks, led by a `prompt_filter_results` chunk with no choices
(and an empty id and model), which must not start the client's stream with an empty id."""

from __future__ import annotations

import orjson

from adapters import openai
from adapters.internal import ChatRequest, StreamEvent
from adapters.sse import SSEEvent, encode_event

__all__ = ["StreamDecoder", "StreamEncoder"]


def _filter_only(data: bytes) -> bool:
    """A chunk that only reports the prompt filter's verdict: no choices, no usage."""
    try:
        obj = orjson.loads(data)
    except orjson.JSONDecodeError:
        return False
    return type(obj) is dict and not obj.get("choices") and obj.get("usage") is None and "error" not in obj


class StreamDecoder(openai.StreamDecoder):
    """Upstream Azure SSE bytes -> internal stream events."""

    __slots__ = ()

    def _event(self, ev: SSEEvent, out: list[StreamEvent]) -> None:
        # Only the leading chunks can be filter reports; later ones go straight through.
        if not self._started and b"prompt_filter_results" in ev.data and _filter_only(ev.data):
            return
        super()._event(ev, out)


class StreamEncoder(openai.StreamEncoder):
    """As Azure streams (the demo upstream's shape): a prompt-filter chunk, then OpenAI's."""

    __slots__ = ("_filter_sent",)

    def __init__(self, *, model: str, request: ChatRequest | None = None) -> None:
        super().__init__(model=model, request=request)
        self._filter_sent = False

    def encode(self, events: list[StreamEvent]) -> bytes:
        head = b""
        if not self._filter_sent and events:
            self._filter_sent = True
            head = encode_event(orjson.dumps({
                "choices": [], "created": 0, "id": "", "model": "", "object": "",
                "prompt_filter_results": [{"prompt_index": 0, "content_filter_results": {}}],
            }))
        return head + super().encode(events)
