"""Compressed bodies through a real Envoy: gzip and br request bodies are inflated before the extproc
reads them, an encoding Envoy cannot inflate is a 415 in the caller's shape, and answers, streams
included, are compressed for clients that accept it (the environment's `compression:`)."""

from __future__ import annotations

import gzip
import zlib

import brotli
import httpx
import openai
import orjson
import pytest

from controlplane.environments import CompressionSettings, EnvironmentConfig
from tests.conftest import DEMO_KEY
from tests.stack_config import small_config, start_stack

pytestmark = pytest.mark.e2e
AUTH = {"authorization": f"Bearer {DEMO_KEY}", "content-type": "application/json"}
BODY = orjson.dumps({"model": "demo-gpt", "messages": [{"role": "user", "content": "squeezed"}]})


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory):
    env = EnvironmentConfig(name="test", admin={"address": "127.0.0.1", "port": 0}, concurrency=1,
                            compression=CompressionSettings(response_encodings=["gzip", "br"], min_response_bytes=0))
    with start_stack(tmp_path_factory.mktemp("compression"), small_config(), env) as s:
        yield s


@pytest.mark.parametrize("encoding,pack", [("gzip", gzip.compress), ("br", brotli.compress)], ids=["gzip", "br"])
def test_compressed_request_bodies_are_read(stack, encoding: str, pack) -> None:
    r = httpx.post(f"{stack.url}/v1/chat/completions", content=pack(BODY), timeout=10,
                   headers={**AUTH, "content-encoding": encoding, "accept-encoding": "identity"})
    assert r.status_code == 200, r.text
    assert "squeezed" in r.json()["choices"][0]["message"]["content"]


def test_an_encoding_envoy_cannot_inflate_is_415_in_the_callers_shape(stack) -> None:
    r = httpx.post(f"{stack.url}/v1/chat/completions", content=zlib.compress(BODY), timeout=10,
                   headers={**AUTH, "content-encoding": "deflate"})
    assert r.status_code == 415
    err = r.json()["error"]
    assert "deflate" in err["message"] and err["type"] == "invalid_request_error"
    m = httpx.post(f"{stack.url}/v1/messages", content=zlib.compress(BODY), timeout=10,
                   headers={"x-api-key": DEMO_KEY, "content-encoding": "deflate", "anthropic-version": "2023-06-01"})
    assert m.status_code == 415 and m.json()["type"] == "error"


def test_a_broken_gzip_body_is_a_client_error(stack) -> None:
    r = httpx.post(f"{stack.url}/v1/chat/completions", content=gzip.compress(BODY)[:20], timeout=10,
                   headers={**AUTH, "content-encoding": "gzip"})
    assert 400 <= r.status_code < 500, r.text


@pytest.mark.parametrize("encoding,unpack", [("gzip", gzip.decompress), ("br", brotli.decompress)],
                         ids=["gzip", "br"])
def test_answers_are_compressed_for_clients_that_ask(stack, encoding: str, unpack) -> None:
    with httpx.Client() as c, c.stream("POST", f"{stack.url}/v1/chat/completions", content=BODY, timeout=10,
                                       headers={**AUTH, "accept-encoding": encoding}) as r:
        raw = b"".join(r.iter_raw())
    assert r.status_code == 200 and r.headers["content-encoding"] == encoding
    assert "squeezed" in orjson.loads(unpack(raw))["choices"][0]["message"]["content"]
    plain = httpx.post(f"{stack.url}/v1/chat/completions", content=BODY, timeout=10,
                       headers={**AUTH, "accept-encoding": "identity"})
    assert plain.status_code == 200 and "content-encoding" not in plain.headers


def test_streams_are_compressed_chunk_by_chunk_and_sdks_read_them(stack) -> None:
    with httpx.Client() as c, c.stream("POST", f"{stack.url}/v1/chat/completions", timeout=10,
                                       content=orjson.dumps({**orjson.loads(BODY), "stream": True}),
                                       headers={**AUTH, "accept-encoding": "gzip"}) as r:
        raw = b"".join(r.iter_raw())
    assert r.headers["content-encoding"] == "gzip"
    text = gzip.decompress(raw).decode()
    assert text.rstrip().endswith("data: [DONE]")
    oai = openai.OpenAI(base_url=f"{stack.url}/v1", api_key=DEMO_KEY, max_retries=0)  # httpx asks gzip itself
    chunks = list(oai.chat.completions.create(model="demo-gpt", stream=True,
                                              messages=[{"role": "user", "content": "squeezed"}]))
    assert "squeezed" in "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
