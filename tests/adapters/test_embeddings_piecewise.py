"""Large embeddings answers read and written one vector at a time (adapters/embeddings/piecewise.py):
the same bytes and vectors as the whole-body calls, and any layout the split cannot prove falls back
to the whole-body parser (which names what is wrong)."""

from __future__ import annotations

import base64

import numpy as np
import orjson
import pytest

from adapters import embeddings
from adapters.embeddings import EmbeddingRequest, EmbeddingResponse
from adapters.embeddings.piecewise import PIECEWISE_BYTES, split_vectors
from contracts.errors import UpstreamError

N, DIMS = 200, 256  # ~500 KB of JSON floats: past PIECEWISE_BYTES
VECS = (np.random.default_rng(3).integers(-128, 128, (N, DIMS)) / 128).astype(np.float32)


def _req(fmt: str) -> EmbeddingRequest:
    return EmbeddingRequest("m", tuple(f"t{i}" for i in range(N)), fmt, DIMS)


@pytest.mark.parametrize("fmt", ["float", "base64"])
def test_openai_answer_is_what_one_dumps_writes(fmt: str) -> None:
    out = embeddings.render_response("openai", EmbeddingResponse("m", VECS, 9), model='m"1', req=_req(fmt))
    rows = [base64.b64encode(v.tobytes()).decode() for v in VECS] if fmt == "base64" else list(VECS)
    whole = orjson.dumps({"object": "list", "data": [{"object": "embedding", "index": i, "embedding": r}
                                                      for i, r in enumerate(rows)],
                          "model": 'm"1', "usage": {"prompt_tokens": 9, "total_tokens": 9}},
                         option=orjson.OPT_SERIALIZE_NUMPY)
    assert out == whole


def test_gemini_answer_is_what_one_dumps_writes_and_reads_back() -> None:
    out = embeddings.render_response("gemini-batch", EmbeddingResponse("m", VECS, None), model="m", req=_req("float"))
    assert out == orjson.dumps({"embeddings": [{"values": v} for v in VECS]}, option=orjson.OPT_SERIALIZE_NUMPY)
    assert len(out) > PIECEWISE_BYTES and split_vectors(out, "values") is not None
    for body in (out, orjson.dumps(orjson.loads(out), option=orjson.OPT_INDENT_2),
                 orjson.dumps({"usageMetadata": {"promptTokenCount": 4}, **orjson.loads(out)})):
        resp = embeddings.parse_response("gemini", body)
        assert np.array_equal(resp.vectors, VECS)
    assert embeddings.parse_response("gemini", orjson.dumps(
        {"usageMetadata": {"promptTokenCount": 4}, **orjson.loads(out)})).input_tokens == 4


def _gemini(rows: list) -> bytes:
    return orjson.dumps({"embeddings": [{"values": r} for r in rows]})


def test_layouts_the_split_cannot_prove_fall_back_to_the_whole_parser() -> None:
    good = [list(map(float, v)) for v in VECS]
    # ragged rows: the whole parser names the mismatch
    with pytest.raises(UpstreamError, match="different lengths"):
        embeddings.parse_response("gemini", _gemini([*good[:-1], good[-1][:-1]]))
    # a nested array inside `values`
    assert split_vectors(_gemini([*good[:-1], [[1.0]] * DIMS]), "values") is None
    # "values" as a string value, and a `values` array outside `embeddings`: cut out too, so the
    # counts disagree with the skeleton and the whole parser reads the answer
    body = orjson.dumps({"embeddings": [{"values": r} for r in good], "note": "values", "x": {"values": good[0]}})
    split = split_vectors(body, "values")
    assert split is not None and len(split[1]) == N + 1
    assert np.array_equal(embeddings.parse_response("gemini", body).vectors, VECS)
    # small bodies are parsed whole
    assert split_vectors(_gemini(good[:2]), "values") is None
