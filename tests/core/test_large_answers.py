"""Large buffered answers, driven through a Session: past 64 KiB the response step is translated in a
worker thread; past `extproc.max_body_bytes` (declared on the response headers, or reached by the
translation itself) the same protocol passes through untranslated and any translation is a 502 in
the caller's shape naming the limit."""

from __future__ import annotations

import inspect

import numpy as np
import orjson
import pytest
import yaml
from envoy.extensions.filters.http.ext_proc.v3 import processing_mode_pb2
from prometheus_client import REGISTRY

from adapters import embeddings
from adapters.embeddings import EmbeddingRequest, EmbeddingResponse
from contracts.config import parse_config
from extproc.flows.offload import INLINE_PARSE_BYTES
from extproc.gateway import Gateway
from extproc.session import Session
from tests.core.session_driver import KEY, ROUTES, body_msg, headers_msg, set_headers
from tests.stack_config import ROOT, without_watermarks

LIMIT = 256 * 1024
OPENAI_H = {":method": "POST", ":path": "/v1/chat/completions", "content-type": "application/json",
            "authorization": f"Bearer {KEY}"}


@pytest.fixture
def gw() -> Gateway:
    data = without_watermarks(yaml.safe_load((ROOT / "modelyard.yaml").read_text()))
    data["extproc"]["max_body_bytes"] = LIMIT
    return Gateway.build(parse_config(data))


def _over(model: str, outcome: str) -> float:
    return sum(REGISTRY.get_sample_value("modelyard_answers_over_limit_total",
                                         {"model": model, "deployment": d, "outcome": outcome}) or 0.0
               for d in ("demo-openai", "demo-gemini", "demo-openai-mini"))


async def _chat(gw: Gateway, model: str) -> Session:
    s = Session(gw, ROUTES)
    await s.handle(headers_msg(OPENAI_H))
    r = await s.handle(body_msg(orjson.dumps({"model": model, "messages": [{"role": "user", "content": "hi"}]})))
    assert r.WhichOneof("response") == "request_body"
    return s


def _gemini_answer(text: str) -> bytes:
    return orjson.dumps({"candidates": [{"content": {"role": "model", "parts": [{"text": text}]},
                                         "finishReason": "STOP"}],
                         "usageMetadata": {"promptTokenCount": 3, "candidatesTokenCount": 9}})


async def test_a_large_answer_is_translated_off_the_loop(gw: Gateway) -> None:
    s = await _chat(gw, "demo-gemini")
    answer = _gemini_answer("x" * (INLINE_PARSE_BYTES * 2))
    await s.handle(headers_msg({":status": "200", "content-type": "application/json",
                                "content-length": str(len(answer))}, response=True))
    assert s.flow is not None
    step = s.flow.response_body(answer, True)
    assert inspect.isawaitable(step)  # the worker-thread path
    r = await step
    out = orjson.loads(r.response_body.response.body_mutation.body)
    assert out["choices"][0]["message"]["content"] == "x" * (INLINE_PARSE_BYTES * 2)
    s.close()


async def test_a_small_answer_stays_inline(gw: Gateway) -> None:
    s = await _chat(gw, "demo-gemini")
    await s.handle(headers_msg({":status": "200", "content-type": "application/json"}, response=True))
    assert s.flow is not None
    r = s.flow.response_body(_gemini_answer("short"), True)
    assert not inspect.isawaitable(r)
    s.close()


async def test_same_protocol_past_the_limit_passes_through_untranslated(gw: Gateway) -> None:
    before = _over("demo-gpt", "passthrough")
    s = await _chat(gw, "demo-gpt")
    r = await s.handle(headers_msg({":status": "200", "content-type": "application/json",
                                    "content-length": str(LIMIT + 1)}, response=True))
    assert r.WhichOneof("response") == "response_headers"
    assert r.mode_override.response_body_mode == processing_mode_pb2.ProcessingMode.NONE
    hs = set_headers(r.response_headers.response.header_mutation)
    assert "content-length" not in hs and hs["x-modelyard-cluster"].startswith("demo-openai")
    assert _over("demo-gpt", "passthrough") == before + 1
    assert s.flow is not None and not s.flow.call.pending  # metered at the headers: no body will come
    s.close()


async def test_translation_past_the_limit_is_a_502_naming_it(gw: Gateway) -> None:
    before = _over("demo-gemini", "refused")
    s = await _chat(gw, "demo-gemini")
    r = await s.handle(headers_msg({":status": "200", "content-type": "application/json",
                                    "content-length": str(LIMIT + 1)}, response=True))
    assert r.immediate_response.status.code == 502
    err = orjson.loads(r.immediate_response.body)["error"]
    assert f"max_body_bytes = {LIMIT}" in err["message"] and "from gemini to openai" in err["message"]
    hs = {h.header.key: h.header.raw_value.decode() for h in r.immediate_response.headers.set_headers}
    assert hs["x-modelyard-task-id"]
    assert _over("demo-gemini", "refused") == before + 1
    s.close()


async def test_an_embeddings_translation_that_outgrows_the_limit_is_a_502(gw: Gateway) -> None:
    # A Gemini caller of an OpenAI deployment: OpenAI's base64 answer fits, its JSON floats do not.
    n, dims = 24, 1536
    texts = [f"t{i}" for i in range(n)]
    body = orjson.dumps({"requests": [{"model": "models/demo-embed", "content": {"parts": [{"text": t}]},
                                       "outputDimensionality": dims} for t in texts]})
    s = Session(gw, ROUTES)
    await s.handle(headers_msg({":method": "POST", ":path": "/v1beta/models/demo-embed:batchEmbedContents",
                                "content-type": "application/json", "x-goog-api-key": KEY}))
    r = await s.handle(body_msg(body))
    sent = orjson.loads(r.request_body.response.body_mutation.body)
    vecs = (np.arange(n * dims).reshape(n, dims) % 255 / 128 - 1).astype(np.float32)
    answer = embeddings.render_response(
        "openai", EmbeddingResponse("m", vecs, 5), model="m",
        req=EmbeddingRequest("m", tuple(texts), sent.get("encoding_format", "float"), dims))
    assert len(answer) <= LIMIT, "the upstream's answer itself fits"
    await s.handle(headers_msg({":status": "200", "content-type": "application/json",
                                "content-length": str(len(answer))}, response=True))
    r = await s.handle(body_msg(answer, response=True))
    hs = set_headers(r.response_body.response.header_mutation)
    assert hs[":status"] == "502"
    err = orjson.loads(r.response_body.response.body_mutation.body)["error"]
    assert err["code"] == 502 and "translated to gemini" in err["message"] and "max_body_bytes" in err["message"]
    s.close()



async def test_a_chunked_answer_that_fits_is_translated_as_usual(gw: Gateway) -> None:
    s = await _chat(gw, "demo-gemini")
    await s.handle(headers_msg({":status": "200", "content-type": "application/json"}, response=True))
    r = await s.handle(body_msg(_gemini_answer("fits"), response=True))
    assert orjson.loads(r.response_body.response.body_mutation.body)["choices"][0]["message"]["content"] == "fits"
    s.close()
