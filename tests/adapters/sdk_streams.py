"""Client SSE bytes read by the official SDKs' own stream parsers and accumulators, as a client
application would read them (no network: the bytes sit in an httpx response)."""

from __future__ import annotations

import anthropic as anthropic_sdk
import httpx
import openai as openai_sdk
from anthropic.lib.streaming._messages import accumulate_event
from openai.lib.streaming.chat import ChatCompletionStreamState
from openai.types.chat import ChatCompletionChunk

_URL = "http://127.0.0.1:9"  # never dialled: the SDK clients only lend their stream machinery


def _response(raw: bytes, path: str) -> httpx.Response:
    return httpx.Response(200, headers={"content-type": "text/event-stream"}, content=raw,
                          request=httpx.Request("POST", _URL + path))


def openai_chunks(raw: bytes) -> list[ChatCompletionChunk]:
    """The chunks `openai.Stream` yields (it raises `APIError` on an error event)."""
    client = openai_sdk.OpenAI(api_key="unused", base_url=_URL + "/v1")
    return list(openai_sdk.Stream(cast_to=ChatCompletionChunk, response=_response(raw, "/v1/chat/completions"),
                                  client=client))


def openai_completion(raw: bytes) -> tuple[list[ChatCompletionChunk], object]:
    """(chunks, the accumulated ChatCompletion snapshot) the way `client.chat.completions.stream` builds it."""
    chunks = openai_chunks(raw)
    state = ChatCompletionStreamState()
    for c in chunks:
        state.handle_chunk(c)
    return chunks, state.current_completion_snapshot


def anthropic_message(raw: bytes) -> anthropic_sdk.types.Message:
    """The final Message `client.messages.stream` accumulates (APIStatusError on an error event)."""
    client = anthropic_sdk.Anthropic(api_key="unused", base_url=_URL)
    stream = anthropic_sdk.Stream(cast_to=anthropic_sdk.types.RawMessageStreamEvent,  # type: ignore[arg-type]
                                  response=_response(raw, "/v1/messages"), client=client)
    snapshot = None
    json_bufs: dict[int, bytes] = {}
    for event in stream:
        snapshot = accumulate_event(event=event, current_snapshot=snapshot, json_bufs=json_bufs)
    assert snapshot is not None, "no events"
    return snapshot
