"""OpenAI `POST /v1/embeddings` <-> the internal embedding request and response (float or base64 vectors)."""

from __future__ import annotations

import base64
import binascii
from typing import TYPE_CHECKING

import orjson

from adapters.embeddings.piecewise import json_with_array
from adapters.embeddings.wire import (
    MAX_EMBED_JSON_VALUES,
    MAX_INPUTS,
    OPENAI_PATH,
    EmbeddingRequest,
    EmbeddingResponse,
    _matrix,
    estimate_tokens,
)
from adapters.fields import bad_upstream, load_object, opt_int, token_count
from adapters.internal import UpstreamRequest
from adapters.json_types import JSONArray, JSONObject
from adapters.limits import check_count
from contracts.errors import ClientError

if TYPE_CHECKING:  # NumPy loads on first use (wire.py says why)
    import numpy as np


def parse_openai_request(body: bytes) -> EmbeddingRequest:
    obj = load_object(body, max_values=MAX_EMBED_JSON_VALUES)
    model = obj.get("model")
    if type(model) is not str or not model:
        raise ClientError("model is required and must be a non-empty string")
    raw = obj.get("input")
    single = type(raw) is str
    if type(raw) is str:
        inputs: tuple[str, ...] = (raw,)
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
    body: JSONObject = {"model": upstream_model, "input": req.inputs[0] if req.single else list(req.inputs),
                  "encoding_format": "base64"}  # 4 bytes a value, and decoding is a frombuffer
    if req.dimensions is not None:
        body["dimensions"] = req.dimensions
    path, headers = openai_target(credential)
    return UpstreamRequest(path, headers, orjson.dumps(body))


def _decode_b64(text: str, where: str) -> np.ndarray:
    import numpy as np

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
    rows: JSONArray = [None] * len(data)
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
    import numpy as np

    tokens = resp.input_tokens if resp.input_tokens is not None else estimate_tokens(req)
    vecs = np.ascontiguousarray(resp.vectors, dtype="<f4")
    b64 = req.encoding_format == "base64"
    # One small write per vector (piecewise.py): the bytes one orjson call writes, without its GIL hold.
    rows = (b'{"object":"embedding","index":' + str(i).encode() + b',"embedding":'
            + (b'"' + base64.b64encode(v.tobytes()) + b'"' if b64
               else orjson.dumps(v, option=orjson.OPT_SERIALIZE_NUMPY)) + b"}"
            for i, v in enumerate(vecs))
    tail = b',"model":' + orjson.dumps(model) + b',"usage":' + orjson.dumps({"prompt_tokens": tokens,
                                                                             "total_tokens": tokens}) + b"}"
    return json_with_array(b'{"object":"list","data":', rows, tail)


# -- same protocol both ways -----------------------------------------------------------------------
def passthrough_request(body: bytes, *, upstream_model: str, credential: str | None) -> UpstreamRequest:
    """The OpenAI caller's own body, only the model name swapped for the upstream's."""
    data: JSONObject = orjson.loads(body)  # parsed and checked once already
    data["model"] = upstream_model
    path, headers = openai_target(credential)
    return UpstreamRequest(path, headers, orjson.dumps(data))
