"""Gemini `:embedContent` / `:batchEmbedContents` <-> the internal embedding request and response."""

from __future__ import annotations

from urllib.parse import quote

import orjson

from adapters.embeddings.piecewise import json_with_array, split_vectors
from adapters.embeddings.wire import MAX_EMBED_JSON_VALUES, MAX_INPUTS, EmbeddingRequest, EmbeddingResponse, _matrix
from adapters.fields import as_object, bad_upstream, load_object, opt_list, token_count
from adapters.internal import UpstreamRequest
from adapters.json_types import JSONArray, JSONObject
from adapters.limits import check_count
from contracts.errors import ClientError


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


def _get(obj: JSONObject, camel: str, snake: str) -> object:
    return obj.get(camel, obj.get(snake))


def _gemini_options(obj: JSONObject, where: str) -> tuple[str | None, str | None, int | None]:
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


def _gemini_entry(req: EmbeddingRequest, text: str, model: str | None) -> JSONObject:
    d: JSONObject = {"content": {"parts": [{"text": text}]}}
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


def _values(e: object, where: str) -> JSONArray:
    vals = e.get("values") if type(e) is dict else None
    if type(vals) is not list:
        raise bad_upstream(f"{where}.values is missing")
    return vals


def _usage(obj: JSONObject) -> int | None:
    usage = obj.get("usageMetadata")
    return token_count(usage.get("promptTokenCount")) if type(usage) is dict else None


def _split_response(body: bytes) -> EmbeddingResponse | None:
    """A large answer read vector by vector (piecewise.py), when its layout is the usual one."""
    split = split_vectors(body, "values")
    if split is None:
        return None
    obj, rows = split
    emb, embs = obj.get("embedding"), obj.get("embeddings")
    entries = [emb] if emb is not None else embs if type(embs) is list else None
    if entries is None or len(entries) != len(rows) or any(type(e) is not dict or e.get("values") != []
                                                           for e in entries):
        return None
    return EmbeddingResponse("", rows, _usage(obj))


def parse_gemini_response(body: bytes) -> EmbeddingResponse:
    if (split := _split_response(body)) is not None:
        return split
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
    return EmbeddingResponse("", _matrix(rows, "embeddings"), _usage(obj))


def render_gemini_response(resp: EmbeddingResponse, *, batch: bool) -> bytes:
    import numpy as np

    vecs = np.ascontiguousarray(resp.vectors, dtype=np.float32)
    if not batch:
        if len(vecs) != 1:
            raise bad_upstream(f"{len(vecs)} embeddings for one content")
        return orjson.dumps({"embedding": {"values": vecs[0]}}, option=orjson.OPT_SERIALIZE_NUMPY)
    # One dumps per vector (piecewise.py): what one call over them all writes, without its GIL hold.
    return json_with_array(b'{"embeddings":', (b'{"values":' + orjson.dumps(v, option=orjson.OPT_SERIALIZE_NUMPY)
                                               + b"}" for v in vecs), b"}")
