"""Azure OpenAI against a recorded exchange (recorded/SOURCES.md) and Azure's documented shapes:
deployment paths, api-version, api-key vs Entra auth, prompt-filter stream chunks, filter errors."""

from __future__ import annotations

from pathlib import Path
from urllib.parse import urlsplit

import orjson
import pytest
import yaml

from adapters import anthropic, azure_openai, openai
from adapters.cloud_targets import AzureTarget
from adapters.internal import RenderOptions, StreamEnd, StreamFinish, StreamStart, TextDelta, UsageUpdate
from adapters.registry import translate_stream
from contracts.errors import UpstreamError

RECORDED = Path(__file__).parent / "recorded"
CASSETTE = yaml.safe_load((RECORDED / "azure-chat-basic.yaml").read_text())["interactions"][0]


def _options(version: str = "2024-12-01-preview", auth: str = "api-key") -> RenderOptions:
    return RenderOptions(cloud=AzureTarget(version, auth))  # type: ignore[arg-type]


def test_recorded_request_renders_to_the_recorded_url_and_body() -> None:
    rec = CASSETTE["request"]
    req = openai.parse_request(rec["body"].encode())
    up = azure_openai.render_request(req, upstream_model="gpt-5-nano", credential="k-1", options=_options())
    url = urlsplit(rec["url"])
    assert up.path == f"{url.path}?api-version={rec['form']['api-version'][0]}"
    sent = orjson.loads(up.body)
    assert sent["messages"] == orjson.loads(rec["body"])["messages"]
    assert up.headers == {"content-type": "application/json", "api-key": "k-1"}


def test_recorded_response_parses_and_translates() -> None:
    body = CASSETTE["response"]["body"].encode()
    resp = azure_openai.parse_response(body)
    assert resp.id == "chatcmpl-CM9n9OhFOl4lSSFwarLEIMnPrNWSP" and resp.model == "gpt-5-nano-2025-08-07"
    assert resp.content.startswith("Hi there! How can I help today?")
    assert (resp.usage.input_tokens, resp.usage.output_tokens, resp.finish_reason) == (8, 271, "stop")
    out = orjson.loads(anthropic.render_response(resp, model="demo-azure"))
    assert out["content"][0]["text"] == resp.content and out["usage"]["output_tokens"] == 271


@pytest.mark.parametrize(("auth", "credential", "header", "value"), [
    ("api-key", "azure-key", "api-key", "azure-key"),
    ("entra", "eyJ0eXAi.token", "authorization", "Bearer eyJ0eXAi.token"),
])
def test_auth_header_per_mode(auth: str, credential: str, header: str, value: str) -> None:
    req = openai.parse_request(b'{"model":"m","messages":[{"role":"user","content":"hi"}]}')
    up = azure_openai.render_request(req, upstream_model="dep/one", credential=credential,
                                     options=_options("2024-10-21", auth))
    assert up.headers[header] == value
    assert ("api-key" in up.headers) == (auth == "api-key")
    assert up.path == "/openai/deployments/dep%2Fone/chat/completions?api-version=2024-10-21"


def test_missing_settings_is_the_gateways_fault() -> None:
    req = openai.parse_request(b'{"model":"m","messages":[{"role":"user","content":"hi"}]}')
    with pytest.raises(UpstreamError):
        azure_openai.render_request(req, upstream_model="d", credential="k", options=None)


def test_client_key_is_read_from_api_key_or_bearer() -> None:
    assert azure_openai.client_api_key({"api-key": "a"}, {}) == "a"
    assert azure_openai.client_api_key({"authorization": "Bearer b"}, {}) == "b"
    assert azure_openai.client_api_key({}, {}) is None


# Azure's documented stream: a prompt-filter chunk (empty id, model, choices) leads; choices carry
# content_filter_results; usage last when stream_options.include_usage was sent.
AZURE_STREAM = b"".join(b"data: " + orjson.dumps(o) + b"\n\n" for o in [
    {"choices": [], "created": 0, "id": "", "model": "", "object": "",
     "prompt_filter_results": [{"prompt_index": 0, "content_filter_results": {
         "hate": {"filtered": False, "severity": "safe"}}}]},
    {"choices": [{"content_filter_results": {}, "delta": {"content": "", "role": "assistant"}, "finish_reason": None,
                  "index": 0}], "created": 1, "id": "chatcmpl-az1", "model": "gpt-4o-2024-08-06",
     "object": "chat.completion.chunk"},
    {"choices": [{"content_filter_results": {"hate": {"filtered": False, "severity": "safe"}},
                  "delta": {"content": "Hello"}, "finish_reason": None, "index": 0}],
     "created": 1, "id": "chatcmpl-az1", "model": "gpt-4o-2024-08-06", "object": "chat.completion.chunk"},
    {"choices": [{"content_filter_results": {}, "delta": {}, "finish_reason": "content_filter", "index": 0}],
     "created": 1, "id": "chatcmpl-az1", "model": "gpt-4o-2024-08-06", "object": "chat.completion.chunk"},
    {"choices": [], "created": 1, "id": "chatcmpl-az1", "model": "gpt-4o-2024-08-06",
     "object": "chat.completion.chunk", "usage": {"prompt_tokens": 9, "completion_tokens": 1, "total_tokens": 10}},
]) + b"data: [DONE]\n\n"


@pytest.mark.parametrize("step", [len(AZURE_STREAM), 7, 1])
def test_stream_skips_the_prompt_filter_chunk(step: int) -> None:
    dec = azure_openai.StreamDecoder()
    events = []
    for i in range(0, len(AZURE_STREAM), step):
        events += dec.feed(AZURE_STREAM[i:i + step])
    events += dec.close()
    assert events[0] == StreamStart("chatcmpl-az1", "gpt-4o-2024-08-06")
    assert [e for e in events if type(e) is TextDelta] == [TextDelta("Hello")]
    assert StreamFinish("content_filter") in events and UsageUpdate(9, 1) in events
    assert type(events[-1]) is StreamEnd


def test_stream_translates_to_an_anthropic_client() -> None:
    req = anthropic.parse_request(b'{"model":"demo-azure","max_tokens":5,"stream":true,'
                                  b'"messages":[{"role":"user","content":"hi"}]}')
    tr = translate_stream("azure-openai", "anthropic", req)
    out = tr.feed(AZURE_STREAM) + tr.finish()
    assert b'"text_delta"' in out and b"Hello" in out and b"message_stop" in out
    assert tr.finished and tr.error is None


def test_demo_encoder_leads_with_the_filter_chunk_the_decoder_drops() -> None:
    enc = azure_openai.StreamEncoder(model="gpt-4o")
    wire = enc.encode([StreamStart("id-1", "gpt-4o"), TextDelta("x"), StreamFinish("stop"), StreamEnd()])
    assert wire.startswith(b'data: {"choices":[]') and b"prompt_filter_results" in wire
    dec = azure_openai.StreamDecoder()
    assert dec.feed(wire)[0] == StreamStart("id-1", "gpt-4o")


def test_content_filter_error_names_the_categories() -> None:
    body = orjson.dumps({"error": {
        "message": "The response was filtered due to the prompt triggering Azure OpenAI's content management policy.",
        "type": None, "param": "prompt", "code": "content_filter", "status": 400,
        "innererror": {"code": "ResponsibleAIPolicyViolation", "content_filter_result": {
            "hate": {"filtered": True, "severity": "high"}, "violence": {"filtered": False, "severity": "safe"}}}}})
    assert azure_openai.parse_error(400, body) == "content filtered: hate (high)"
    assert azure_openai.parse_error(401, b'{"error":{"code":"401","message":"Access denied"}}') == "Access denied"
    assert orjson.loads(azure_openai.render_error(404, "Resource not found"))["error"]["code"] == "not_found_error"
