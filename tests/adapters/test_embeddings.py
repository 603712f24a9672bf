"""The embeddings adapter (adapters/embeddings.py): OpenAI and Gemini shapes, both ways,
table-driven; vectors checked exactly (float32), usage reported or estimated."""

from __future__ import annotations

import base64

import numpy as np
import orjson
import pytest
from openai.types import CreateEmbeddingResponse

from adapters import embeddings
from adapters.embeddings import EmbeddingRequest, EmbeddingResponse, EmbeddingRoute
from contracts.config import parse_config
from contracts.errors import ClientError, ConfigError, UpstreamError

VECS = np.array([[0.5, -0.25, 1.0], [0.125, 0.0, -1.0]], np.float32)


# ---- paths ---------------------------------------------------------------------------------

@pytest.mark.parametrize(("method", "path", "route"), [
    ("POST", "/v1/embeddings", EmbeddingRoute("openai")),
    ("POST", "/embeddings", EmbeddingRoute("openai")),
    ("POST", "/v1beta/models/text-embedding-004:embedContent", EmbeddingRoute("gemini", "text-embedding-004")),
    ("POST", "/v1beta/models/e:batchEmbedContents?key=k", EmbeddingRoute("gemini-batch", "e")),
    ("POST", "/v1/models/a%2Fb:embedContent", EmbeddingRoute("gemini", "a/b")),
    ("GET", "/v1/embeddings", None),
    ("POST", "/v1beta/models/e:generateContent", None),
    ("POST", "/v1beta/models/:embedContent", None),
    ("POST", "/v1/chat/completions", None),
], ids=[
    "openai", "openai-unversioned", "gemini", "gemini-batch-with-key", "gemini-escaped-model", "GET-refused",
    "generateContent-not-embeddings", "empty-model", "chat-not-embeddings"
])
def test_match_path(method: str, path: str, route: EmbeddingRoute | None) -> None:
    assert embeddings.match_path(method, path) == route


# ---- requests ------------------------------------------------------------------------------

PARSE_CASES = [
    ("openai string", "openai", None, {"model": "e", "input": "hello"},
     EmbeddingRequest("e", ("hello",), single=True)),
    ("openai list, base64, dimensions", "openai", None,
     {"model": "e", "input": ["a", "b"], "encoding_format": "base64", "dimensions": 64, "user": "u"},
     EmbeddingRequest("e", ("a", "b"), "base64", 64)),
    ("gemini embedContent", "gemini", "e",
     {"content": {"parts": [{"text": "hello"}]}, "taskType": "RETRIEVAL_QUERY", "outputDimensionality": 8},
     EmbeddingRequest("e", ("hello",), "float", 8, "RETRIEVAL_QUERY", single=True)),
    ("gemini parts are one text, snake_case accepted", "gemini", "models/e",
     {"content": {"parts": [{"text": "a"}, {"text": "b"}]}, "task_type": "RETRIEVAL_DOCUMENT", "title": "T"},
     EmbeddingRequest("e", ("a b",), "float", None, "RETRIEVAL_DOCUMENT", "T", single=True)),
    ("gemini batch", "gemini-batch", "e",
     {"requests": [{"model": "models/e", "content": {"parts": [{"text": "x"}]}},
                   {"content": {"parts": [{"text": "y"}]}}]},
     EmbeddingRequest("e", ("x", "y"))),
]


@pytest.mark.parametrize(("case", "shape", "path_model", "body", "expected"), PARSE_CASES,
                         ids=[c[0] for c in PARSE_CASES])
def test_parse_request(case: str, shape: embeddings.Shape, path_model: str | None, body: dict,
                       expected: EmbeddingRequest) -> None:
    assert embeddings.parse_request(shape, orjson.dumps(body), path_model=path_model) == expected


REJECT_CASES = [
    ("openai", None, {"input": "x"}, "model is required"),
    ("openai", None, {"model": "e"}, "input must be"),
    ("openai", None, {"model": "e", "input": []}, "input must be"),
    ("openai", None, {"model": "e", "input": [1, 2, 3]}, "token arrays"),
    ("openai", None, {"model": "e", "input": [[1, 2], [3]]}, "token arrays"),
    ("openai", None, {"model": "e", "input": ["a", ""]}, "must not be empty"),
    ("openai", None, {"model": "e", "input": "a", "encoding_format": "int8"}, "encoding_format"),
    ("openai", None, {"model": "e", "input": "a", "dimensions": 0}, "dimensions"),
    ("gemini", "e", {"content": {"parts": [{"inlineData": {"mimeType": "image/png", "data": "AA=="}}]}},
     "only text parts"),
    ("gemini", "e", {"content": {"parts": []}}, "non-empty"),
    ("gemini", "e", {}, "content must be an object"),
    ("gemini-batch", "e", {"requests": []}, "requests must be"),
    ("gemini-batch", "e", {"requests": [{"model": "models/f", "content": {"parts": [{"text": "x"}]}}]},
     "must match"),
    ("gemini-batch", "e", {"requests": [{"content": {"parts": [{"text": "x"}]}, "taskType": "A"},
                                        {"content": {"parts": [{"text": "y"}]}, "taskType": "B"}]},
     "must share"),
]


@pytest.mark.parametrize(("shape", "path_model", "body", "message"), REJECT_CASES,
                         ids=[f"{c[0]}: {c[3]}" for c in REJECT_CASES])
def test_parse_request_rejects(shape: embeddings.Shape, path_model: str | None, body: dict, message: str) -> None:
    with pytest.raises(ClientError) as e:
        embeddings.parse_request(shape, orjson.dumps(body), path_model=path_model)
    assert e.value.status == 400 and message in e.value.message


def test_too_many_inputs_is_a_413() -> None:
    with pytest.raises(ClientError) as e:
        embeddings.parse_request("openai", orjson.dumps({"model": "e", "input": ["x"] * 2049}))
    assert e.value.status == 413


@pytest.mark.parametrize(("protocol", "path", "auth"), [
    ("openai", "/v1/embeddings", ("authorization", "Bearer k")),
    ("gemini", "/v1beta/models/up%2Fm:batchEmbedContents", ("x-goog-api-key", "k")),
], ids=["openai", "gemini-batch"])
def test_render_request_round_trips(protocol: str, path: str, auth: tuple[str, str]) -> None:
    req = EmbeddingRequest("client", ("a", "b"), "float", 16, "RETRIEVAL_QUERY" if protocol == "gemini" else None)
    up = embeddings.render_request(protocol, req, upstream_model="up/m", credential="k")
    assert up.path == path and up.headers[auth[0]] == auth[1]
    shape: embeddings.Shape = "openai" if protocol == "openai" else "gemini-batch"
    back = embeddings.parse_request(shape, up.body, path_model="up/m")
    assert (back.model, back.inputs, back.dimensions, back.task_type) == ("up/m", req.inputs, 16, req.task_type)
    if protocol == "openai":
        assert orjson.loads(up.body)["encoding_format"] == "base64"  # cheaper to carry and to decode


def test_single_openai_input_stays_a_string_upstream() -> None:
    up = embeddings.render_request("openai", EmbeddingRequest("e", ("x",), single=True), upstream_model="u",
                                   credential=None)
    assert orjson.loads(up.body)["input"] == "x" and "authorization" not in up.headers


def test_only_openai_and_gemini_deployments_serve_embeddings() -> None:
    with pytest.raises(UpstreamError):
        embeddings.render_request("anthropic", EmbeddingRequest("e", ("x",)), upstream_model="u", credential=None)
    cfg = {"models": [{"name": "e", "task_types": ["embedding"],
                       "deployments": [{"cluster": "c", "protocol": "anthropic", "endpoints": ["h:1"]}]}],
           "tenants": [{"name": "t", "api_keys": ["0" * 64]}]}
    with pytest.raises(ConfigError, match="cannot serve embeddings"):
        parse_config(cfg)


# ---- responses -----------------------------------------------------------------------------

def _b64(v: np.ndarray) -> str:
    return base64.b64encode(v.astype("<f4").tobytes()).decode()


UPSTREAM_CASES = [
    ("openai floats", "openai", {"object": "list", "model": "m", "usage": {"prompt_tokens": 7, "total_tokens": 7},
                                 "data": [{"object": "embedding", "index": i, "embedding": v.tolist()}
                                          for i, v in enumerate(VECS)]}, 7),
    ("openai base64, out of order", "openai",
     {"object": "list", "model": "m", "data": [{"index": 1, "embedding": _b64(VECS[1])},
                                               {"index": 0, "embedding": _b64(VECS[0])}]}, None),
    ("gemini batch", "gemini", {"embeddings": [{"values": v.tolist()} for v in VECS]}, None),
]


@pytest.mark.parametrize(("case", "protocol", "body", "tokens"), UPSTREAM_CASES, ids=[c[0] for c in UPSTREAM_CASES])
def test_parse_response(case: str, protocol: str, body: dict, tokens: int | None) -> None:
    resp = embeddings.parse_response(protocol, orjson.dumps(body))
    assert np.array_equal(resp.vectors, VECS) and resp.vectors.dtype == np.float32
    assert resp.input_tokens == tokens


def test_parse_gemini_single_embedding() -> None:
    resp = embeddings.parse_response("gemini", orjson.dumps({"embedding": {"values": [1.5, -2.0]}}))
    assert resp.vectors.tolist() == [[1.5, -2.0]] and resp.input_tokens is None


@pytest.mark.parametrize(("protocol", "raw"), [
    ("openai", b"<html>"),
    ("openai", b'{"object": "list"}'),
    ("openai", b'{"data": [{"index": 0, "embedding": [1, 2]}, {"index": 0, "embedding": [3, 4]}]}'),
    ("openai", b'{"data": [{"index": 0, "embedding": [1, 2]}, {"index": 1, "embedding": [3]}]}'),
    ("openai", b'{"data": [{"index": 0, "embedding": "not base64!"}]}'),
    ("openai", b'{"data": [{"index": 0, "embedding": ["a"]}]}'),
    ("gemini", b'{"embeddings": [{"vals": []}]}'),
    ("gemini", b'{"candidates": []}'),
], ids=[
    "openai-html", "openai-no-data", "openai-duplicate-index", "openai-ragged", "openai-bad-base64",
    "openai-string-floats", "gemini-no-values", "gemini-chat-answer"
])
def test_parse_response_rejects_unreadable_upstream(protocol: str, raw: bytes) -> None:
    with pytest.raises(UpstreamError):
        embeddings.parse_response(protocol, raw)


@pytest.mark.parametrize("fmt", ["float", "base64"])
def test_render_openai_response_is_a_valid_sdk_response(fmt: embeddings.EncodingFormat) -> None:
    req = EmbeddingRequest("e", ("abcdefgh", "x"), fmt)
    raw = embeddings.render_response("openai", EmbeddingResponse("up", VECS, None), model="client", req=req)
    obj = orjson.loads(raw)
    if fmt == "base64":  # the SDK decodes base64 into floats (little-endian float32) before its type applies
        assert all(type(d["embedding"]) is str for d in obj["data"])
        for d in obj["data"]:
            d["embedding"] = np.frombuffer(base64.b64decode(d["embedding"]), "<f4").tolist()
    out = CreateEmbeddingResponse.model_validate(obj)
    assert out.model == "client" and [d.index for d in out.data] == [0, 1]
    # No upstream usage: the estimate (chars / 4, at least 1 per input) is reported.
    assert out.usage.prompt_tokens == embeddings.estimate_tokens(req) == 3
    assert np.array_equal(np.array([d.embedding for d in out.data], np.float32), VECS)


@pytest.mark.parametrize(("shape", "key"), [("gemini", "embedding"), ("gemini-batch", "embeddings")])
def test_render_gemini_response(shape: embeddings.Shape, key: str) -> None:
    vecs = VECS[:1] if shape == "gemini" else VECS
    req = EmbeddingRequest("e", ("a",) * len(vecs))
    out = orjson.loads(embeddings.render_response(shape, EmbeddingResponse("up", vecs, 3), model="e", req=req))
    values = [out[key]["values"]] if shape == "gemini" else [e["values"] for e in out[key]]
    assert np.array_equal(np.array(values, np.float32), vecs)


def test_a_count_mismatch_is_the_upstreams_fault() -> None:
    with pytest.raises(UpstreamError):
        embeddings.render_response("openai", EmbeddingResponse("up", VECS, 1), model="e",
                                   req=EmbeddingRequest("e", ("only one",)))


@pytest.mark.parametrize(("body", "tokens"), [
    (b'{"data": [], "usage": {"prompt_tokens": 12}}', 12),
    (b'{"usage": {"prompt_tokens": 7, "total_tokens": 7}, "data": [], "model": "m"}', 7),  # usage first
    (b'{"data": [], "usage": {"prompt_tokens_details": {"cached": 1}, "prompt_tokens": 9}}', 9),  # nested
    (b'{"data": [{"embedding": "usage"}], "usage": {"total_tokens": 3}}', None),
    (b'{"data": []}', None),
    (b"nope", None),
], ids=["usage-last", "usage-first", "nested-details", "no-prompt-tokens", "no-usage", "not-json"])
def test_openai_usage_for_a_passthrough(body: bytes, tokens: int | None) -> None:
    assert embeddings.openai_usage(body) == tokens


def test_openai_usage_reads_the_tail_of_a_big_answer() -> None:
    vecs = np.ones((64, 1536), np.float32)
    body = orjson.dumps({"object": "list", "data": [{"index": i, "embedding": _b64(v)} for i, v in enumerate(vecs)],
                         "model": "m", "usage": {"prompt_tokens": 64, "total_tokens": 64}})
    assert embeddings.openai_usage(body) == 64


@pytest.mark.parametrize(("inputs", "total", "longest"), [
    (("a",), 1, 1),
    (("abcdefgh", "x"), 3, 2),
    (("w" * 400, "w" * 40, ""), 111, 100),
], ids=["one-char", "two-inputs", "long-and-empty"])
def test_token_estimates(inputs: tuple[str, ...], total: int, longest: int) -> None:
    req = EmbeddingRequest("e", inputs)
    assert embeddings.estimate_tokens(req) == total and embeddings.longest_input_tokens(req) == longest
