"""extproc/duplex.py: a session's buffered steps spoken in FULL_DUPLEX_STREAMED, driven with plain
messages in the order Envoy sends them (headers, then the body's chunks without waiting)."""

from __future__ import annotations

import orjson
import pytest

from extproc import messages as msg
from extproc.duplex import DuplexSession, _fold_mutation
from extproc.gateway import Gateway
from extproc.session import Session
from tests.core.session_driver import KEY, ROUTES, body_msg, chat_headers, headers_msg, set_headers

CHAT = orjson.dumps({"model": "demo-gpt", "messages": [{"role": "user", "content": "hi"}]})
ANSWER = orjson.dumps({"id": "x", "object": "chat.completion", "created": 1, "model": "demo-gpt",
                       "choices": [{"index": 0, "message": {"role": "assistant", "content": "yo"},
                                    "finish_reason": "stop"}],
                       "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}})
JSON = {":status": "200", "content-type": "application/json"}


def _duplex(gateway: Gateway, limit: int = 1 << 20) -> DuplexSession:
    return DuplexSession(Session(gateway, ROUTES), limit)


def _streamed(r: msg.ProcessingResponse, kind: str) -> tuple[bytes, bool]:
    sr = getattr(r, kind).response.body_mutation.streamed_response
    return sr.body, sr.end_of_stream


async def _request(d: DuplexSession, headers: dict[str, str], body: bytes, pieces: int = 2) -> list:
    assert await d.handle(headers_msg(headers)) == []  # held: the body decides the route
    cut = len(body) // pieces
    for i in range(pieces - 1):
        assert await d.handle(body_msg(body[i * cut:(i + 1) * cut], eos=False)) == []
    return await d.handle(body_msg(body[(pieces - 1) * cut:]))


async def test_a_unary_call_answers_each_side_once_its_body_has_come(gateway: Gateway) -> None:
    d = _duplex(gateway)
    headers, body = await _request(d, chat_headers(), CHAT, pieces=3)
    # the headers reply carries the body step's route choice and header changes, then the body comes back whole
    common = headers.request_headers.response
    hs = set_headers(common.header_mutation)
    assert hs["x-modelyard-cluster"] == "demo-openai" and common.clear_route_cache
    # a spoofed internal header is removed and the body step's own value stands (removals go before sets)
    sent_upstream = _applied({**chat_headers(), "x-modelyard-tenant": "spoofed"}, common.header_mutation)
    assert sent_upstream["x-modelyard-tenant"] == "demo"
    # the caller's key never goes upstream (removed, or replaced by the deployment's where one is configured)
    assert "authorization" in common.header_mutation.remove_headers or "authorization" in hs
    sent, end = _streamed(body, "request_body")
    assert end and orjson.loads(sent)["messages"] == [{"role": "user", "content": "hi"}]

    assert await d.handle(headers_msg(JSON, response=True)) == []
    assert await d.handle(body_msg(ANSWER[:40], response=True, eos=False)) == []
    headers, body = await d.handle(body_msg(ANSWER[40:], response=True))
    assert not headers.HasField("mode_override")  # duplex modes are fixed for the stream
    assert len(set_headers(headers.response_headers.response.header_mutation)["x-modelyard-task-id"]) == 32
    sent, end = _streamed(body, "response_body")
    assert end and orjson.loads(sent)["choices"][0]["message"]["content"] == "yo"
    d.close()


async def test_the_sessions_shared_replies_are_never_changed(gateway: Gateway) -> None:
    # The session hands every call the same prebuilt headers reply: folding into it would pile each
    # call's headers onto the next (Envoy refuses a mutation of more than 100 headers).
    counts = set()
    for _ in range(3):
        d = _duplex(gateway)
        headers, _ = await _request(d, chat_headers(), CHAT)
        counts.add(len(headers.request_headers.response.header_mutation.remove_headers))
        d.close()
    assert len(counts) == 1


async def test_the_answer_equals_the_buffered_sessions(gateway: Gateway) -> None:
    # An Anthropic caller on an OpenAI deployment: the same rendering and translation either way.
    h = {":method": "POST", ":path": "/v1/messages", "content-type": "application/json", "x-api-key": KEY,
         "anthropic-version": "2023-06-01"}
    req = orjson.dumps({"model": "demo-gpt", "max_tokens": 16, "messages": [{"role": "user", "content": "hi"}]})
    s = Session(gateway, ROUTES)
    await s.handle(headers_msg(h))
    buffered = await s.handle(body_msg(req))
    await s.handle(headers_msg(JSON, response=True))
    answer = await s.handle(body_msg(ANSWER, response=True))
    s.close()
    d = _duplex(gateway)
    _, body = await _request(d, h, req)
    assert _streamed(body, "request_body")[0] == buffered.request_body.response.body_mutation.body
    await d.handle(headers_msg(JSON, response=True))
    _, body = await d.handle(body_msg(ANSWER, response=True))
    mine, theirs = orjson.loads(_streamed(body, "response_body")[0]), orjson.loads(
        answer.response_body.response.body_mutation.body)
    assert mine["type"] == "message" and mine["content"] == theirs["content"] and mine["usage"] == theirs["usage"]
    d.close()


async def test_an_sse_answer_goes_chunk_by_chunk(gateway: Gateway) -> None:
    d = _duplex(gateway)
    stream = orjson.loads(CHAT) | {"stream": True}
    await _request(d, chat_headers(), orjson.dumps(stream))
    [headers] = await d.handle(headers_msg({":status": "200", "content-type": "text/event-stream"}, response=True))
    assert headers.WhichOneof("response") == "response_headers" and not headers.HasField("mode_override")
    chunk = b'data: {"id":"x","object":"chat.completion.chunk","created":1,"model":"demo-gpt","choices":' \
            b'[{"index":0,"delta":{"content":"yo"},"finish_reason":null}]}\n\n'
    [first] = await d.handle(body_msg(chunk, response=True, eos=False))
    sent, end = _streamed(first, "response_body")
    assert b'"yo"' in sent and not end
    [last] = await d.handle(body_msg(b"data: [DONE]\n\n", response=True, eos=True))
    assert _streamed(last, "response_body")[1]
    d.close()


async def test_refusals_come_at_once_in_the_callers_shape(gateway: Gateway) -> None:
    [r] = await _duplex(gateway).handle(headers_msg(chat_headers("sk-nope")))
    assert r.immediate_response.status.code == 401
    d = _duplex(gateway)
    [r] = await _request(d, chat_headers(), b'{"model": "nope", "messages": [{"role": "user", "content": "x"}]}')
    assert r.immediate_response.status.code == 404  # the body step's answer stands for both replies
    d.close()


async def test_a_body_past_the_limit_is_a_413_in_the_callers_protocol(gateway: Gateway) -> None:
    d = _duplex(gateway, limit=2048)
    h = {":method": "POST", ":path": "/v1/messages", "content-type": "application/json", "x-api-key": KEY}
    assert await d.handle(headers_msg(h)) == []
    assert await d.handle(body_msg(b"x" * 2000, eos=False)) == []
    [r] = await d.handle(body_msg(b"x" * 100, eos=False))
    assert r.immediate_response.status.code == 413
    assert orjson.loads(r.immediate_response.body)["type"] == "error"  # Anthropic's error shape
    d.close()


async def test_a_bodiless_call_and_trailers(gateway: Gateway) -> None:
    [r] = await _duplex(gateway).handle(headers_msg(chat_headers() | {":method": "GET"}, eos=True))
    assert r.immediate_response.status.code == 404
    d = _duplex(gateway)
    assert await d.handle(headers_msg(chat_headers())) == []
    assert await d.handle(body_msg(CHAT, eos=False)) == []
    headers, body, trailers = await d.handle(msg.ProcessingRequest(request_trailers=msg.pb.HttpTrailers()))
    # the body's last bytes do not end the message: its trailers (a decompressor's counts) do
    assert headers.request_headers.response.clear_route_cache and _streamed(body, "request_body") == (CHAT, False)
    assert trailers.WhichOneof("response") == "request_trailers"
    d.close()


def _applied(headers: dict[str, str], m: msg.pb.HeaderMutation) -> dict[str, str]:
    """`headers` after Envoy applies `m`: its removals first, then its sets in order."""
    out = {k: v for k, v in headers.items() if k not in set(m.remove_headers)}
    for h in m.set_headers:
        assert h.append_action == h.OVERWRITE_IF_EXISTS_OR_ADD  # the only action the session sets
        out[h.header.key] = h.header.raw_value.decode()
    return out


@pytest.mark.parametrize(("first", "then"), [
    (([("a", "1"), ("b", "1")], ["c", "d"]), ([("c", "2")], ["a"])),  # each removes what the other sets
    (([("a", "1")], []), ([("a", "2")], [])),  # both set one header
    (([], ["a", "b"]), ([("a", "2")], ["b"])),  # both remove one; the later sets what the first removed
    (([("a", "1"), ("b", "1"), ("a", "3")], ["x"]), ([], ["a", "x"])),  # the later removes a header set twice
])
def test_the_folded_mutation_does_what_the_two_in_turn_would(first: tuple, then: tuple) -> None:
    start = {"a": "0", "b": "0", "c": "0", "d": "0", "x": "0"}
    into, later = msg.mutation(*first), msg.mutation(*then)
    in_turn = _applied(_applied(start, into), later)
    _fold_mutation(into, later)
    assert _applied(start, into) == in_turn


async def test_stream_chunks_that_came_together_go_on_together(gateway: Gateway) -> None:
    d = _duplex(gateway)
    await _request(d, chat_headers(), orjson.dumps(orjson.loads(CHAT) | {"stream": True}))
    await d.handle(headers_msg({":status": "200", "content-type": "text/event-stream"}, response=True))
    event = b'data: {"id":"x","object":"chat.completion.chunk","created":1,"model":"demo-gpt","choices":' \
            b'[{"index":0,"delta":{"content":"%s"},"finish_reason":null}]}\n\n'
    # the next message already waits: nothing yet, then one reply with both events (cut mid-event, too)
    second = event % b"two"
    assert await d.handle(body_msg(event % b"one" + second[:20], response=True, eos=False), more=True) == []
    [both] = await d.handle(body_msg(second[20:], response=True, eos=False), more=False)
    sent, end = _streamed(both, "response_body")
    assert b'"one"' in sent and b'"two"' in sent and not end
    assert await d.handle(body_msg(event % b"three", response=True, eos=False), more=True) == []
    # trailers end it: the gathered event goes first
    last, trailers = await d.handle(msg.ProcessingRequest(response_trailers=msg.pb.HttpTrailers()))
    assert b'"three"' in _streamed(last, "response_body")[0]
    assert trailers.WhichOneof("response") == "response_trailers"
    d.close()
