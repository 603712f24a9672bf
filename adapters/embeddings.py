"""Embeddings: OpenAI `POST /v1/embeddings` <-> Gemini `:embedContent` / `:batchEmbedContents`,
pure functions over bytes through one internal request and response.

Vectors travel as one float32 NumPy matrix (rows = inputs): OpenAI's embeddings are float32
(what its base64 encoding carries), parsing base64 is a `frombuffer`, and orjson renders the
matrix without a Python float per value. Upstreams are asked for base64 where they have it.
"""

from __future__ import annotations

import base64
import binascii
from dataclasses import dataclass, field
from typing import Literal
from urllib.parse import quote, unquote

import numpy as np
import orjson

from adapters.fields import as_object, bad_upstream, load_object, opt_int, opt_list, token_count
from adapters.internal import UpstreamRequest
from adapters.limits import check_count
from modelyard.errors import ClientError, UpstreamError

__all__ = [
    "OPENAI_PATH", "EMBEDDING_PROTOCOLS", "EmbeddingRequest", "EmbeddingResponse", "EmbeddingRoute", "match_path", "estimate_tokens", "longest_input_tokens",
    "parse_openai_request", "openai_target", "render_openai_request", "parse_openai_response", "render_openai_response",
    "parse_gemini_request", "render_gemini_request", "parse_gemini_response", "render_gemini_response",
    "parse_request", "render_request", "parse_response", "render_response", "openai_usage",
    "passes_through", "passthrough_request",
]

OPENAI_PATH = "/v1/embeddings"
MAX_INPUTS = 2048  # OpenAI's own limit per request; Gemini batches take 100, checked by Gemini itself
MAX_EMBED_JSON_VALUES = 50_000
# The deployment protocols that serve embeddings (config load refuses others on an embedding model).
EMBEDDING_PROTOCOLS = frozenset({"openai", "gemini"})
_GEMINI_PREFIXES = ("/v1beta/models/", "/v1/models/")

# Which wire shape a request or answer is in: OpenAI, Gemini embedContent, Gemini batchEmbedContents.
Shape = Literal["openai", "gemini", "gemini-batch"]
EncodingFormat = Literal["float", "base64"]


@dataclass(frozen=True, slots=True)
class EmbeddingRequest:
    model: str
    inputs: tuple[str, ...]
    encoding_format: EncodingFormat = "float"  # what the client wants back (OpenAI only)
    dimensions: int | None = None  # OpenAI `dimensions` = Gemini `outputDimensionality`
    task_type: str | None = None  # Gemini `taskType` (RETRIEVAL_QUERY, ...); OpenAI has no such field
    title: str | None = None  # Gemini `title` (RETRIEVAL_DOCUMENT only)
    single: bool = False  # OpenAI `input` was one string, not a list (the upstream gets it back alike)


@dataclass(frozen=True, slots=True, eq=False)
class EmbeddingResponse:
    model: str
    vectors: np.ndarray  # float32, shape (inputs, dimensions)
    input_tokens: int | None = None  # None: the upstream does not report usage (Gemini)
    extra: dict = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class EmbeddingRoute:
    shape: Shape
    model: str | None = None  # from the path (Gemini)


def match_path(method: str, path: str) -> EmbeddingRoute | None:
    """An embeddings endpoint from method and path (query string ignored), else None."""
    if method.upper() != "POST":
        return None
    p = path.split("?", 1)[0]
    if p == OPENAI_PATH or p == "/embeddings":
        return EmbeddingRoute("openai")
    for prefix in _GEMINI_PREFIXES:
        if p.startswith(prefix):
            model, sep, action = p[len(prefix):].rpartition(":")
            if sep and model and action == "embedContent":
                return EmbeddingRoute("gemini", unquote(model))
            if sep and model and action == "batchEmbedContents":
                return EmbeddingRoute("gemini-batch", unquote(model))
    return None


def estimate_tokens(req: EmbeddingRequest) -> int:
    """A rate-limit and metering estimate when the upstream reports none: chars / 4, 1 per input at least."""
    return sum(max(1, len(s) // 4) for s in req.inputs)


def longest_input_tokens(req: EmbeddingRequest) -> int:
    """The longest input's estimate: what a model's context window must hold (inputs embed one by one)."""
    return max(max(1, len(s) // 4) for s in req.inputs)


# ---- OpenAI --------------------------------------------------------------------------------


def parse_openai_request(body: bytes) -> EmbeddingRequest:
    obj = load_object(body, max_values=MAX_EMBED_JSON_VALUES)
    model = obj.get("model")
    if type(model) is not str or not model:
        raise ClientError("model is required and must be a non-empty string")
    raw = obj.get("input")
    single = type(raw) is str
    if single:
        inputs: tuple = (raw,)
    elif type(raw) is list and raw and all(type(s) is str for s in raw):
        inputs = tuple(raw)
    elif type(raw) is list and raw and all(type(s) in (int, list) for s in raw):
        raise ClientError("input as token arrays is not supported: send text")
    else:
        raise ClientError("input must be a string or a non-empty array of strings")
    check_count(inputs, MAX_INPUTS, "input")
    if any(not s for s in inputs):
        raise ClientError("input strings must not be empty")
    fmt = obj.get("encoding_format", "float")
    if fmt != "float" and fmt != "base64":
        raise ClientError("encoding_format must be 'float' or 'base64'")
    return EmbeddingRequest(model, inputs, fmt, opt_int(obj, "dimensions", "body"), single=single)


def openai_target(credential: str | None) -> tuple[str, dict[str, str]]:
    """Path and headers of an OpenAI embeddings request (a passthrough keeps the client's body)."""
    headers = {"content-type": "application/json"}
    if credential:
        headers["authorization"] = "Bearer " + credential
    return OPENAI_PATH, headers


def render_openai_request(req: EmbeddingRequest, *, upstream_model: str, credential: str | None) -> UpstreamRequest:
    body: dict = {"model": upstream_model, "input": req.inputs[0] if req.single else list(req.inputs),
                  "encoding_format": "base64"}  # 4 bytes a value, and decoding is a frombuffer
    if req.dimensions is not None:
        body["dimensions"] = req.dimensions
    path, headers = openai_target(credential)
    return UpstreamRequest(path, headers, orjson.dumps(body))


def _matrix(rows: list, where: str) -> np.ndarray:
    if not rows:
        return np.zeros((0, 0), np.float32)
    width = len(rows[0])
    if any(len(r) != width for r in rows):
        raise bad_upstream(f"{where}: vectors of different lengths")
    try:
        return np.array(rows, dtype=np.float32).reshape(len(rows), width)
    except (TypeError, ValueError):
        raise bad_upstream(f"{where}: a vector holds something other than numbers") from None


def _decode_b64(text: str, where: str) -> np.ndarray:
    try:
        raw = base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise bad_upstream(f"{where}: invalid base64") from None
    if len(raw) % 4:
        raise bad_upstream(f"{where}: base64 is not float32 data")
    return np.frombuffer(raw, dtype="<f4")


def parse_openai_response(body: bytes) -> EmbeddingResponse:
    try:
        obj = load_object(body, "upstream response")
    except ClientError as e:
        raise bad_upstream(e.message) from None
    data = obj.get("data")
    if type(data) is not list:
        raise bad_upstream("no data")
    rows: list = [None] * len(data)
    for j, d in enumerate(data):
        if type(d) is not dict:
            raise bad_upstream(f"data[{j}] is not an object")
        idx = d.get("index", j)
        if type(idx) is not int or not 0 <= idx < len(data) or rows[idx] is not None:
            raise bad_upstream(f"data[{j}].index is missing or repeated")
        emb = d.get("embedding")
        if type(emb) is str:
            rows[idx] = _decode_b64(emb, f"data[{j}].embedding")
        elif type(emb) is list:
            rows[idx] = emb
        else:
            raise bad_upstream(f"data[{j}].embedding is missing")
    usage = obj.get("usage")
    tokens = token_count(usage.get("prompt_tokens")) if type(usage) is dict else None
    model = obj.get("model")
    return EmbeddingResponse(model if type(model) is str else "", _matrix(rows, "data"), tokens)


_USAGE_KEY = b'"usage"'
_USAGE_TAIL = 4096  # OpenAI puts usage after the vectors: its object is all a passthrough reads


def openai_usage(body: bytes) -> int | None:
    """The prompt tokens an OpenAI embeddings answer reports (a passthrough reads only this): the
    `usage` object is found from the end and parsed alone, not megabytes of vectors before it."""
    at = body.rfind(_USAGE_KEY, max(0, len(body) - _USAGE_TAIL))
    if at >= 0:
        start, end = body.find(b"{", at), body.find(b"}", at)
        if 0 <= start < end:
            try:
                usage = orjson.loads(body[start:end + 1])
            except orjson.JSONDecodeError:
                usage = None  # details nested in it, or an odd layout: read the whole answer
            if type(usage) is dict:
                return token_count(usage.get("prompt_tokens")) if "prompt_tokens" in usage else None
    try:
        obj = orjson.loads(body)
    except orjson.JSONDecodeError:
        return None
    usage = obj.get("usage") if type(obj) is dict else None
    return token_count(usage.get("prompt_tokens")) if type(usage) is dict else None


def render_openai_response(resp: EmbeddingResponse, *, model: str, req: EmbeddingRequest) -> bytes:
    tokens = resp.input_tokens if resp.input_tokens is not None else estimate_tokens(req)
    vecs = np.ascontiguousarray(resp.vectors, dtype="<f4")
    if req.encoding_format == "base64":
        rows: list = [base64.b64encode(v.tobytes()).decode() for v in vecs]
    else:
        rows = list(vecs)
    data = [{"object": "embedding", "index": i, "embedding": r} for i, r in enumerate(rows)]
    return orjson.dumps({"object": "list", "data": data, "model": model,
                         "usage": {"prompt_tokens": tokens, "total_tokens": tokens}},
                        option=orjson.OPT_SERIALIZE_NUMPY)


# ---- Gemini --------------------------------------------------------------------------------


def _gemini_text(content: object, where: str) -> str:
    c = as_object(content, where)
    parts = opt_list(c, "parts", where)
    if not parts:
        raise ClientError(f"{where}.parts must be a non-empty array")
    texts = []
    for j, p in enumerate(parts):
        p = as_object(p, f"{where}.parts[{j}]")
        text = p.get("text")
        if type(text) is not str:
            raise ClientError(f"{where}.parts[{j}]: only text parts can be embedded")
        texts.append(text)
    # Gemini embeds a content's parts as one text.
    out = " ".join(texts) if len(texts) > 1 else texts[0]
    if not out:
        raise ClientError(f"{where}: text must not be empty")
    return out


def _get(obj: dict, camel: str, snake: str) -> object:
    return obj.get(camel, obj.get(snake))


def _gemini_options(obj: dict, where: str) -> tuple[str | None, str | None, int | None]:
    task = _get(obj, "taskType", "task_type")
    title = _get(obj, "title", "title")
    dims = _get(obj, "outputDimensionality", "output_dimensionality")
    if task is not None and type(task) is not str:
        raise ClientError(f"{where}.taskType must be a string")
    if title is not None and type(title) is not str:
        raise ClientError(f"{where}.title must be a string")
    if dims is not None and (type(dims) is not int or dims < 1):
        raise ClientError(f"{where}.outputDimensionality must be an integer >= 1")
    return task, title, dims


def _bare_model(name: object, where: str) -> str:
    if type(name) is not str or not name:
        raise ClientError(f"{where} must be a non-empty string")
    return name[7:] if name.startswith("models/") else name


def parse_gemini_request(body: bytes, *, path_model: str, batch: bool) -> EmbeddingRequest:
    obj = load_object(body, max_values=MAX_EMBED_JSON_VALUES)
    model = _bare_model(path_model, "the path's model")
    if not batch:
        task, title, dims = _gemini_options(obj, "body")
        return EmbeddingRequest(model, (_gemini_text(obj.get("content"), "content"),), "float", dims, task, title,
                                single=True)
    reqs = obj.get("requests")
    if type(reqs) is not list or not reqs:
        raise ClientError("requests must be a non-empty array")
    check_count(reqs, MAX_INPUTS, "requests")
    inputs: list[str] = []
    options: set[tuple[str | None, str | None, int | None]] = set()
    for i, r in enumerate(reqs):
        where = f"requests[{i}]"
        r = as_object(r, where)
        if "model" in r and _bare_model(r["model"], f"{where}.model") != model:
            raise ClientError(f"{where}.model must match the model in the path ({model})")
        inputs.append(_gemini_text(r.get("content"), f"{where}.content"))
        options.add(_gemini_options(r, where))
    if len(options) > 1:
        raise ClientError("requests must share taskType, title and outputDimensionality")
    task, title, dims = options.pop()
    return EmbeddingRequest(model, tuple(inputs), "float", dims, task, title)


def _gemini_entry(req: EmbeddingRequest, text: str, model: str | None) -> dict:
    d: dict = {"content": {"parts": [{"text": text}]}}
    if model is not None:
        d["model"] = "models/" + model
    if req.task_type is not None:
        d["taskType"] = req.task_type
    if req.title is not None:
        d["title"] = req.title
    if req.dimensions is not None:
        d["outputDimensionality"] = req.dimensions
    return d


def render_gemini_request(req: EmbeddingRequest, *, upstream_model: str, credential: str | None) -> UpstreamRequest:
    """Always batchEmbedContents: one shape for one input or many."""
    path = f"/v1beta/models/{quote(upstream_model, safe='')}:batchEmbedContents"
    body = {"requests": [_gemini_entry(req, t, upstream_model) for t in req.inputs]}
    headers = {"content-type": "application/json"}
    if credential:
        headers["x-goog-api-key"] = credential
    return UpstreamRequest(path, headers, orjson.dumps(body))


def _values(e: object, where: str) -> list:
    vals = e.get("values") if type(e) is dict else None
    if type(vals) is not list:
        raise bad_upstream(f"{where}.values is missing")
    return vals


def parse_gemini_response(body: bytes) -> EmbeddingResponse:
    try:
        obj = load_object(body, "upstream response")
    except ClientError as e:
        raise bad_upstream(e.message) from None
    if "embedding" in obj:
        rows = [_values(obj["embedding"], "embedding")]
    elif type(obj.get("embeddings")) is list:
        rows = [_values(e, f"embeddings[{j}]") for j, e in enumerate(obj["embeddings"])]
    else:
        raise bad_upstream("no embedding or embeddings")
    usage = obj.get("usageMetadata")
    tokens = token_count(usage.get("promptTokenCount")) if type(usage) is dict else None
    return EmbeddingResponse("", _matrix(rows, "embeddings"), tokens)


def render_gemini_response(resp: EmbeddingResponse, *, batch: bool) -> bytes:
    vecs = np.ascontiguousarray(resp.vectors, dtype=np.float32)
    if not batch:
        if len(vecs) != 1:
            raise bad_upstream(f"{len(vecs)} embeddings for one content")
        return orjson.dumps({"embedding": {"values": vecs[0]}}, option=orjson.OPT_SERIALIZE_NUMPY)
    return orjson.dumps({"embeddings": [{"values": v} for v in vecs]}, option=orjson.OPT_SERIALIZE_NUMPY)


# ---- by shape (what the flow and the demo upstreams call) ----------------------------------


def parse_request(shape: Shape, body: bytes, *, path_model: str | None = None) -> EmbeddingRequest:
    if shape == "openai":
        return parse_openai_request(body)
    if path_model is None:
        raise ClientError("model is required in the path /v1beta/models/{model}:embedContent")
    return parse_gemini_request(body, path_model=path_model, batch=shape == "gemini-batch")


def render_request(protocol: str, req: EmbeddingRequest, *, upstream_model: str,
                   credential: str | None) -> UpstreamRequest:
    """The upstream request for a deployment speaking `protocol` (openai or gemini)."""
    if protocol == "openai":
        return render_openai_request(req, upstream_model=upstream_model, credential=credential)
    if protocol == "gemini":
        return render_gemini_request(req, upstream_model=upstream_model, credential=credential)
    # Config load refuses such a deployment (EMBEDDING_PROTOCOLS); reaching here is a bug upstream of us.
    raise UpstreamError(f"a {protocol} deployment cannot serve embeddings")


def parse_response(protocol: str, body: bytes) -> EmbeddingResponse:
    return parse_openai_response(body) if protocol == "openai" else parse_gemini_response(body)


def render_response(shape: Shape, resp: EmbeddingResponse, *, model: str, req: EmbeddingRequest) -> bytes:
    if len(resp.vectors) != len(req.inputs):
        raise bad_upstream(f"{len(resp.vectors)} embeddings for {len(req.inputs)} inputs")
    if shape == "openai":
        return render_openai_response(resp, model=model, req=req)
    return render_gemini_response(resp, batch=shape == "gemini-batch")


# -- same protocol both ways -----------------------------------------------------------------------
def passes_through(shape: Shape, protocol: str) -> bool:
    """An OpenAI caller of an OpenAI upstream keeps its own bytes both ways (only the model swapped)."""
    return shape == "openai" and protocol == "openai"


def passthrough_request(body: bytes, *, upstream_model: str, credential: str | None) -> UpstreamRequest:
    """The OpenAI caller's own body, only the model name swapped for the upstream's."""
    data = orjson.loads(body)
    data["model"] = upstream_model
    path, headers = openai_target(credential)
    return UpstreamRequest(path, headers, orjson.dumps(data))
