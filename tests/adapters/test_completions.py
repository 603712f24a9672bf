"""OpenAI's legacy Completions API (adapters/completions): the request as a one-turn ChatRequest,
what only a Completions server can take, the answer and the stream both ways, and the translation
to and from Chat Completions through the hub (as a chat-only deployment gets it)."""

from __future__ import annotations

import orjson
import pytest

from adapters import completions, openai
from adapters.injected_usage import InjectedUsageFilter
from adapters.internal import ChatResponse, Message, StreamEnd, StreamFinish, StreamStart, TextDelta, TextPart, Usage
from adapters.registry import translate_stream
from contracts.errors import ClientError


def _parse(**body: object) -> object:
    return completions.parse_request(orjson.dumps({"model": "m", **body}))


def test_a_prompt_is_one_user_turn_with_openais_default_of_16_tokens() -> None:
    req = completions.parse_request(b'{"model": "m", "prompt": "Once upon a time", "temperature": 0.5, '
                                    b'"stop": "\\n", "seed": 0, "top_k": -1, "user": "u1", "ignore_eos": true}')
    assert req.messages == (Message("user", (TextPart("Once upon a time"),)),)
    assert (req.system, req.max_tokens, req.temperature, req.stop, req.seed, req.top_k) == \
        (None, 16, 0.5, ("\n",), 0, None)  # top_k -1 is vLLM's "off"
    assert req.task == "completion" and req.native_only is None and not req.stream


@pytest.mark.parametrize(("body", "native"), [
    pytest.param({"prompt": "x", "echo": True}, "echo", id="echo"),
    pytest.param({"prompt": "x", "logprobs": 0}, "logprobs", id="logprobs"),
    pytest.param({"prompt": "x", "suffix": "end"}, "suffix", id="suffix"),
    pytest.param({"prompt": "x", "n": 2}, "n > 1", id="n"),
    pytest.param({"prompt": "x", "best_of": 3}, "best_of > 1", id="best_of"),
    pytest.param({"prompt": ["a", "b"]}, "several prompts in one call", id="several-prompts"),
    pytest.param({"prompt": [1, 2, 3]}, "a prompt of token ids", id="token-ids"),
    pytest.param({"prompt": [[1, 2], [3]]}, "prompts of token ids", id="token-id-lists"),
    pytest.param({"prompt": ["one"], "n": 1, "echo": False, "logprobs": None}, None, id="plain-after-all"),
])
def test_what_only_a_completions_server_can_take_is_marked(body: dict[str, object], native: str | None) -> None:
    req = _parse(**body)
    assert req.native_only == native  # type: ignore[attr-defined]


def test_token_prompts_keep_their_size_and_start_for_routing() -> None:
    req = completions.parse_request(b'{"model": "m", "prompt": [[101, 2023], [7]]}')
    assert [m.content for m in req.messages] == [(TextPart("101,2023"),), (TextPart("7"),)]


@pytest.mark.parametrize(("body", "message"), [
    pytest.param({}, "prompt is required", id="no-prompt"),
    pytest.param({"prompt": ""}, "must not be empty", id="empty"),
    pytest.param({"prompt": ["a", ""]}, "every prompt", id="an-empty-one"),
    pytest.param({"prompt": {"text": "x"}}, "prompt is required", id="object"),
    pytest.param({"prompt": ["a", 1]}, "prompt must be", id="mixed"),
    pytest.param({"prompt": "x", "max_tokens": 0}, "max_tokens", id="max-tokens"),
    pytest.param({"prompt": "x", "logprobs": "yes"}, "logprobs", id="logprobs-type"),
    pytest.param({"prompt": "x", "stop": 3}, "stop", id="stop"),
    pytest.param({"prompt": "x", "stream_options": 1}, "stream_options", id="stream-options"),
])
def test_bad_requests_are_400s_naming_the_field(body: dict[str, object], message: str) -> None:
    with pytest.raises(ClientError, match=message) as e:
        _parse(**body)
    assert e.value.status == 400


def test_passthrough_keeps_every_field_and_switches_stream_usage_on() -> None:
    body = orjson.dumps({"model": "m", "prompt": "x", "logprobs": 2, "echo": True, "stream": True})
    req = completions.parse_request(body)
    out, injected = completions.passthrough_body(body, req, upstream_model="up")
    assert injected and orjson.loads(out) == {"model": "up", "prompt": "x", "logprobs": 2, "echo": True,
                                              "stream": True, "stream_options": {"include_usage": True}}
    assert completions.request_target(req, upstream_model="up", credential="k") == \
        ("/v1/completions", {"content-type": "application/json", "authorization": "Bearer k"})


def test_translated_to_chat_the_prompt_is_the_user_turn() -> None:
    req = completions.parse_request(b'{"model": "m", "prompt": "Say hi", "max_tokens": 5, "stream": true}')
    up = openai.render_request(req, upstream_model="gpt", credential=None)
    assert up.path == "/v1/chat/completions"
    assert orjson.loads(up.body) == {"model": "gpt", "messages": [{"role": "user", "content": "Say hi"}],
                                     "max_completion_tokens": 5, "stream": True,
                                     "stream_options": {"include_usage": True}}


def test_rendered_for_a_completions_server_from_a_one_turn_request() -> None:
    req = completions.parse_request(b'{"model": "m", "prompt": "abc", "top_k": 5, "stop": ["x"]}')
    up = completions.render_request(req, upstream_model="base", credential=None)
    assert (up.path, orjson.loads(up.body)) == ("/v1/completions", {"model": "base", "prompt": "abc", "max_tokens": 16,
                                                                     "top_k": 5, "stop": ["x"]})
    chat = openai.parse_request(b'{"model": "m", "messages": [{"role": "system", "content": "s"}, '
                                b'{"role": "user", "content": "u"}]}')
    with pytest.raises(ClientError, match="one plain-text prompt"):
        completions.render_request(chat, upstream_model="base", credential=None)


def test_a_chat_answer_comes_back_as_a_text_completion() -> None:
    chat = (b'{"id": "chatcmpl-1", "object": "chat.completion", "model": "gpt", "choices": [{"index": 0, '
            b'"message": {"role": "assistant", "content": "Hello there"}, "finish_reason": "length"}], '
            b'"usage": {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5, '
            b'"prompt_tokens_details": {"cached_tokens": 1}}}')
    out = orjson.loads(completions.render_response(openai.parse_response(chat), model="m"))
    assert out["object"] == "text_completion" and out["model"] == "m" and out["id"] == "chatcmpl-1"
    assert out["choices"] == [{"text": "Hello there", "index": 0, "logprobs": None, "finish_reason": "length"}]
    assert out["usage"] == {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5,
                            "prompt_tokens_details": {"cached_tokens": 1}}


def test_a_completions_answer_is_read_for_its_text_and_every_choices_usage() -> None:
    body = (b'{"id": "cmpl-9", "object": "text_completion", "model": "base", "choices": ['
            b'{"index": 0, "text": " one", "logprobs": null, "finish_reason": "stop"},'
            b'{"index": 1, "text": " two", "logprobs": null, "finish_reason": "length"}],'
            b'"usage": {"prompt_tokens": 4, "completion_tokens": 6, "total_tokens": 10}}')
    resp = completions.parse_response(body)
    assert (resp.id, resp.content, resp.finish_reason, resp.usage) == ("cmpl-9", " one", "stop", Usage(4, 6))
    with pytest.raises(Exception, match="no choices"):
        completions.parse_response(b'{"choices": []}')
    assert completions.parse_error(400, completions.render_error(400, "bad prompt")) == "bad prompt"


_CHAT_STREAM = (b'data: {"id":"c1","object":"chat.completion.chunk","model":"gpt","choices":[{"index":0,'
                b'"delta":{"role":"assistant","content":""}}]}\n\n'
                b'data: {"id":"c1","object":"chat.completion.chunk","model":"gpt","choices":[{"index":0,'
                b'"delta":{"content":"Hel"}}]}\n\n'
                b'data: {"id":"c1","object":"chat.completion.chunk","model":"gpt","choices":[{"index":0,'
                b'"delta":{"content":"lo"},"finish_reason":"stop"}]}\n\n'
                b'data: {"id":"c1","object":"chat.completion.chunk","model":"gpt","choices":[],'
                b'"usage":{"prompt_tokens":3,"completion_tokens":2,"total_tokens":5}}\n\n'
                b'data: [DONE]\n\n')


def _events(raw: bytes) -> list[dict[str, object]]:
    return [orjson.loads(line[6:]) for line in raw.split(b"\n\n") if line.startswith(b"data: {")]


@pytest.mark.parametrize("include_usage", [False, True])
def test_a_chat_stream_comes_back_as_completion_chunks(include_usage: bool) -> None:
    req = completions.parse_request(orjson.dumps({"model": "m", "prompt": "p", "stream": True,
                                                  "stream_options": {"include_usage": include_usage}}))
    tr = translate_stream("openai", "completions", req)
    out = b"".join(tr.feed(_CHAT_STREAM[i:i + 7]) for i in range(0, len(_CHAT_STREAM), 7)) + tr.finish()
    chunks = _events(out)
    assert all(c["object"] == "text_completion" and c["model"] == "m" and c["id"] == "c1" for c in chunks)
    texts = [c["choices"][0] for c in chunks if c["choices"]]  # type: ignore[index]
    assert "".join(t["text"] for t in texts) == "Hello"
    assert [t["finish_reason"] for t in texts][-1] == "stop"
    assert ("usage" in chunks[-1]) is include_usage and out.endswith(b"data: [DONE]\n\n")
    assert tr.finished and tr.meter.reported == Usage(3, 2)


_COMPLETION_STREAM = (b'data: {"id":"cmpl-1","object":"text_completion","model":"base","choices":[{"index":0,'
                      b'"text":" t","logprobs":null,"finish_reason":null}]}\n\n'
                      b'data: {"id":"cmpl-1","object":"text_completion","model":"base","choices":[{"index":0,'
                      b'"text":" t t","logprobs":null,"finish_reason":"length"}]}\n\n'
                      b'data: {"id":"cmpl-1","object":"text_completion","model":"base","choices":[],'
                      b'"usage":{"prompt_tokens":7,"completion_tokens":3,"total_tokens":10}}\n\n'
                      b'data: [DONE]\n\n')


def test_the_completions_decoder_reads_text_finish_and_usage() -> None:
    dec = completions.StreamDecoder()
    events = dec.feed(_COMPLETION_STREAM) + dec.close()
    assert events[0] == StreamStart("cmpl-1", "base")
    assert [e for e in events if isinstance(e, TextDelta)] == [TextDelta(" t"), TextDelta(" t t")]
    assert StreamFinish("length") in events and isinstance(events[-1], StreamEnd)
    cut = completions.StreamDecoder()
    first = _COMPLETION_STREAM.index(b"\n\n") + 2
    assert cut.feed(_COMPLETION_STREAM[:first]) and "before [DONE]" in cut.close()[-1].message  # type: ignore[attr-defined]


def test_a_passthrough_stream_loses_only_the_usage_chunk_the_gateway_asked_for() -> None:
    f = InjectedUsageFilter(completions.StreamDecoder())
    out = b"".join(f.feed(_COMPLETION_STREAM[i:i + 50]) for i in range(0, len(_COMPLETION_STREAM), 50)) + f.finish()
    assert out == _COMPLETION_STREAM.replace(_COMPLETION_STREAM.split(b"\n\n")[2] + b"\n\n", b"")
    assert f.finished and f.meter.reported == Usage(7, 3)


def test_an_answer_encoded_for_a_completions_client_round_trips() -> None:
    resp = ChatResponse("cmpl-2", "m", "abc", finish_reason="length", usage=Usage(1, 2))
    assert completions.parse_response(completions.render_response(resp, model="m")).content == "abc"
    enc = completions.StreamEncoder(model="m")
    raw = enc.encode([StreamStart("cmpl-2", "up"), TextDelta("ab"), TextDelta("c"), StreamFinish("length"), StreamEnd()])
    dec = completions.StreamDecoder()
    assert "".join(e.text for e in dec.feed(raw) if isinstance(e, TextDelta)) == "abc"
