"""The rest of the surface through a real Envoy with the real SDKs: Anthropic's count_tokens, the
Responses API's input-token count and each protocol's model listing from config; OpenAI images (generations, edits) and audio
(transcriptions, translations, streamed speech) passed through to the demo upstreams `demo-image`,
`demo-whisper` and `demo-tts`, metered per image, second and character. One stack for the module.
"""

from __future__ import annotations

import base64
import io
import os
import sqlite3
import time

import anthropic
import httpx
import openai
import pytest

from adapters import anthropic as anthropic_adapter
from adapters import responses as responses_adapter
from adapters.internal import estimate_prompt_tokens
from devstack.demo.media import PNG, wav
from tests.conftest import DEMO_KEY, UPSTREAM_KEYS
from tests.stack_config import demo_config_free_ports, start_stack

pytestmark = pytest.mark.e2e

L3_KEY = "sk-modelyard-demo-l3"  # tenant demo-l3: demo-mini, demo-gpt and auto only


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory):
    workdir = tmp_path_factory.mktemp("surface")
    data, _ = demo_config_free_ports()
    keep = ("demo-gpt", "demo-claude", "demo-image", "demo-whisper", "demo-tts")
    data["models"] = [m for m in data["models"] if m["name"] in keep]
    for m in data["models"]:
        m["deployments"] = m["deployments"][:1]
        for d in m["deployments"]:
            d.pop("warmup", None)
            d.pop("watermark", None)
    for name, value in UPSTREAM_KEYS.items():
        os.environ.setdefault(name, value)
    with start_stack(workdir, data, shared_demos=True) as s:
        yield s


def _oai(stack) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{stack.url}/v1", api_key=DEMO_KEY, max_retries=0)


def _metered(stack, task_id: str) -> tuple[str, int, float]:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        with sqlite3.connect(stack.cfg.extproc.metering_db) as db:
            row = db.execute("SELECT model, status, cost FROM requests WHERE task_id = ?", (task_id,)).fetchone()
        if row:
            return row
        time.sleep(0.1)
    raise AssertionError(f"no metering row for {task_id}")


# ---------------------------------------------------------------- counting and models
def test_count_tokens_is_the_gateways_own_estimate(stack) -> None:
    client = anthropic.Anthropic(base_url=stack.url, api_key=DEMO_KEY, max_retries=0)
    messages = [{"role": "user", "content": "How many tokens is this sentence, roughly?"}]
    got = client.messages.count_tokens(model="demo-claude", system="Be brief.", messages=messages)  # type: ignore[arg-type]
    body = {"model": "demo-claude", "max_tokens": 1, "system": "Be brief.", "messages": messages}
    req = anthropic_adapter.parse_request(__import__("orjson").dumps(body))
    assert got.input_tokens == estimate_prompt_tokens(req) > 0
    with pytest.raises(anthropic.NotFoundError):
        client.messages.count_tokens(model="no-such-model", messages=messages)  # type: ignore[arg-type]
    with pytest.raises(anthropic.BadRequestError):
        client.messages.count_tokens(model="demo-claude", messages="nope")  # type: ignore[arg-type]


def test_responses_input_tokens_is_the_same_estimate_in_openais_shape(stack) -> None:
    client = _oai(stack)
    got = client.responses.input_tokens.count(model="demo-gpt", instructions="Be brief.",
                                              input="How many tokens is this sentence, roughly?")
    req = responses_adapter.parse_request(__import__("orjson").dumps(
        {"model": "demo-gpt", "instructions": "Be brief.", "input": "How many tokens is this sentence, roughly?"}))
    assert got.object == "response.input_tokens" and got.input_tokens == estimate_prompt_tokens(req) > 0
    assert client.responses.input_tokens.count(input="How many tokens is this sentence, roughly?").input_tokens > 0
    with pytest.raises(openai.NotFoundError) as e:
        client.responses.input_tokens.count(model="no-such-model", input="x")
    assert e.value.body["code"] == "model_not_found"  # type: ignore[index]
    with pytest.raises(openai.BadRequestError) as e:  # no stored state here: refused as a call would be
        client.responses.input_tokens.count(model="demo-gpt", input="x", previous_response_id="resp_1")


def test_several_choices_pass_through_to_an_openai_upstream_and_are_refused_in_translation(stack) -> None:
    client, ask = _oai(stack), [{"role": "user", "content": "three takes please"}]
    one = client.chat.completions.create(model="demo-gpt", messages=ask)  # type: ignore[arg-type]
    raw = client.chat.completions.with_raw_response.create(model="demo-gpt", n=3, messages=ask)  # type: ignore[arg-type]
    got = raw.parse()
    assert [c.index for c in got.choices] == [0, 1, 2]
    assert {c.message.content for c in got.choices} == {one.choices[0].message.content}
    assert one.usage is not None and got.usage is not None
    assert got.usage.completion_tokens == 3 * one.usage.completion_tokens  # the upstream's own count, metered
    task = raw.headers["x-modelyard-task-id"]
    with sqlite3.connect(stack.cfg.extproc.metering_db) as db:
        _metered(stack, task)
        assert db.execute("SELECT output_tokens FROM requests WHERE task_id = ?", (task,)).fetchone() == (
            got.usage.completion_tokens,)
    texts: dict[int, str] = {}
    usage = None
    for chunk in client.chat.completions.create(model="demo-gpt", n=2, stream=True, messages=ask,  # type: ignore[arg-type]
                                                stream_options={"include_usage": True}):
        for c in chunk.choices:
            texts[c.index] = texts.get(c.index, "") + (c.delta.content or "")
        usage = chunk.usage or usage
    assert texts == {0: one.choices[0].message.content, 1: one.choices[0].message.content}
    assert usage is not None and usage.completion_tokens == 2 * one.usage.completion_tokens
    with pytest.raises(openai.BadRequestError, match=r"n > 1.*speaks anthropic"):  # one answer per Messages call
        client.chat.completions.create(model="demo-claude", n=2, messages=ask)  # type: ignore[arg-type]
    with pytest.raises(openai.BadRequestError, match=r"n must be"):
        client.chat.completions.create(model="demo-gpt", n=0, messages=ask)  # type: ignore[arg-type]


def test_anthropics_web_search_passes_through_to_claude_and_is_billed_per_search(stack) -> None:
    # demo-claude: $3 / $15 per 1M tokens, $0.01 a search (Anthropic's $10 per 1,000)
    client = anthropic.Anthropic(base_url=stack.url, api_key=DEMO_KEY, max_retries=0)
    tools = [{"type": "web_search_20250305", "name": "web_search", "max_uses": 2}]
    ask = [{"role": "user", "content": "who won the final"}]
    raw = client.messages.with_raw_response.create(model="demo-claude", max_tokens=64, tools=tools,  # type: ignore[arg-type]
                                                   messages=ask)  # type: ignore[arg-type]
    msg = raw.parse()
    assert [b.type for b in msg.content] == ["server_tool_use", "web_search_tool_result", "text"]
    assert msg.usage.server_tool_use is not None and msg.usage.server_tool_use.web_search_requests == 1
    tokens = (msg.usage.input_tokens * 3.0 + msg.usage.output_tokens * 15.0) / 1000
    assert _metered(stack, raw.headers["x-modelyard-task-id"])[2] == pytest.approx(tokens + 0.01)
    with client.messages.stream(model="demo-claude", max_tokens=64, tools=tools, messages=ask) as s:  # type: ignore[arg-type]
        final = s.get_final_message()
        task = s.response.headers["x-modelyard-task-id"]
    assert final.usage.server_tool_use is not None and final.usage.server_tool_use.web_search_requests == 1
    tokens = (final.usage.input_tokens * 3.0 + final.usage.output_tokens * 15.0) / 1000
    assert _metered(stack, task)[2] == pytest.approx(tokens + 0.01)
    with pytest.raises(anthropic.BadRequestError, match=r"tools\[0\]\.web_search_20250305.*speaks openai"):
        client.messages.create(model="demo-gpt", max_tokens=64, tools=tools, messages=ask)  # type: ignore[arg-type]


def test_each_protocol_lists_models_from_config(stack) -> None:
    client = anthropic.Anthropic(base_url=stack.url, api_key=DEMO_KEY, max_retries=0)
    ids = [m.id for m in client.models.list()]
    assert "demo-claude" in ids and "demo-image" in ids
    card = client.models.retrieve("demo-claude")
    assert card.type == "model" and card.id == "demo-claude"
    with pytest.raises(anthropic.NotFoundError) as e:
        client.models.retrieve("no-such-model")
    assert e.value.body["type"] == "error" and e.value.body["error"]["type"] == "not_found_error"  # Anthropic's shape
    stranger = anthropic.Anthropic(base_url=stack.url, api_key="sk-not-a-key", max_retries=0)
    with pytest.raises(anthropic.AuthenticationError) as e:
        stranger.models.list()
    assert e.value.body["error"]["type"] == "authentication_error" and e.value.body["type"] == "error"
    assert "demo-claude" in [m.id for m in _oai(stack).models.list()]  # OpenAI's shape on the same path
    r = httpx.get(f"{stack.url}/v1beta/models", headers={"x-goog-api-key": DEMO_KEY}, timeout=10)
    assert r.status_code == 200, r.text
    gemini = {m["name"]: m for m in r.json()["models"]}
    assert "generateContent" in gemini["models/demo-claude"]["supportedGenerationMethods"]
    r = httpx.get(f"{stack.url}/v1beta/models/demo-gpt?key={L3_KEY}", timeout=10)
    assert r.status_code == 200 and r.json()["name"] == "models/demo-gpt"
    r = httpx.get(f"{stack.url}/v1beta/models/demo-claude?key={L3_KEY}", timeout=10)  # not demo-l3's
    assert r.status_code == 404 and r.json()["error"]["status"] == "NOT_FOUND"


# ---------------------------------------------------------------- images
def test_image_generations_and_edits(stack) -> None:
    oai = _oai(stack)
    raw = oai.images.with_raw_response.generate(model="demo-image", prompt="a small blue square", n=2,
                                                response_format="b64_json")
    res = raw.parse()
    assert res.data is not None and len(res.data) == 2
    assert base64.b64decode(res.data[0].b64_json or "") == PNG
    assert _metered(stack, raw.headers["x-modelyard-task-id"]) == ("demo-image", 200, pytest.approx(2 * 0.04))
    res = oai.images.generate(model="demo-image", prompt="by link")
    assert res.data is not None and res.data[0].url and httpx.get(res.data[0].url, timeout=5).content == PNG
    edited = oai.images.edit(model="demo-image", image=("in.png", io.BytesIO(PNG), "image/png"),
                             prompt="make it red", response_format="b64_json")
    assert edited.data is not None and base64.b64decode(edited.data[0].b64_json or "") == PNG
    with pytest.raises(openai.BadRequestError):
        oai.images.generate(model="demo-image", prompt="too many", n=50)
    with pytest.raises(openai.BadRequestError):
        oai.images.generate(model="demo-claude", prompt="a chat model draws nothing")
    with pytest.raises(openai.NotFoundError):
        oai.images.generate(model="no-such-model", prompt="x")


# ---------------------------------------------------------------- audio
def test_transcriptions_and_translations(stack) -> None:
    oai = _oai(stack)
    clip = wav(bytes(16000 * 2 * 3), 16000)  # three seconds of 16 kHz silence
    raw = oai.audio.transcriptions.with_raw_response.create(model="demo-whisper", file=("clip.wav", clip))
    text = raw.parse().text
    assert text == "[demo-whisper] transcript of clip.wav (3.00 s)"
    assert _metered(stack, raw.headers["x-modelyard-task-id"]) == ("demo-whisper", 200, pytest.approx(3 * 0.0001))
    verbose = oai.audio.transcriptions.create(model="demo-whisper", file=("clip.wav", clip),
                                              response_format="verbose_json")
    assert verbose.duration == pytest.approx(3.0)
    plain = oai.audio.transcriptions.create(model="demo-whisper", file=("clip.wav", clip), response_format="text")
    assert plain.strip() == text  # type: ignore[union-attr]
    translated = oai.audio.translations.create(model="demo-whisper", file=("clip.wav", clip))
    assert translated.text == "[demo-whisper] translation of clip.wav (3.00 s)"
    r = httpx.post(f"{stack.url}/v1/audio/transcriptions", headers={"authorization": f"Bearer {DEMO_KEY}"},
                   files={"model": (None, "demo-whisper")}, timeout=10)  # no file
    assert r.status_code == 400 and "file" in r.json()["error"]["message"]


def test_speech_streams_audio_back(stack) -> None:
    oai = _oai(stack)
    text = "Hello from the gateway, spoken by the demo."
    with oai.audio.speech.with_streaming_response.create(model="demo-tts", voice="alloy", input=text,
                                                         response_format="wav") as resp:
        assert resp.headers["content-type"] == "audio/wav"
        chunks = list(resp.iter_bytes())
        task_id = resp.headers["x-modelyard-task-id"]
    audio = b"".join(chunks)
    assert audio[:4] == b"RIFF" and audio[8:12] == b"WAVE" and len(audio) > 44
    assert _metered(stack, task_id) == ("demo-tts", 200, pytest.approx(len(text) * 0.015 / 1000))
    mp3 = oai.audio.speech.create(model="demo-tts", voice="alloy", input="default format").content
    assert mp3[:2] == b"\xff\xfb"  # MPEG frames, OpenAI's default mp3
    with pytest.raises(openai.BadRequestError):
        oai.audio.speech.create(model="demo-tts", voice="alloy", input="")
