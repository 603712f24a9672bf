"""Embeddings of several callers as one call (adapters/embeddings/batch.py): merge, split, usage shares."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from adapters import embeddings
from adapters.embeddings import EmbeddingRequest, EmbeddingResponse
from adapters.embeddings.batch import merge_key, merge_requests, share_tokens, split_response
from contracts.errors import UpstreamError


def test_merge_keeps_every_caller_inputs_in_order_as_a_list() -> None:
    a = EmbeddingRequest("m", ("one",), "float", single=True)
    b = EmbeddingRequest("m", ("two", "three"), "base64")
    merged = merge_requests([a, b])
    assert merged.inputs == ("one", "two", "three") and not merged.single and merged.encoding_format == "base64"
    assert merge_key(a) == merge_key(b)


def test_requests_that_differ_beyond_inputs_do_not_merge() -> None:
    a = EmbeddingRequest("m", ("x",), dimensions=64)
    b = EmbeddingRequest("m", ("y",), dimensions=32)
    assert merge_key(a) != merge_key(b)
    assert merge_key(EmbeddingRequest("m", ("x",), task_type="RETRIEVAL_QUERY")) != merge_key(
        EmbeddingRequest("m", ("x",), task_type="RETRIEVAL_DOCUMENT"))
    with pytest.raises(ValueError):
        merge_requests([a, b])


def test_split_gives_each_caller_its_rows_and_a_share_of_usage() -> None:
    reqs = [EmbeddingRequest("m", ("a" * 40,)), EmbeddingRequest("m", ("b" * 4, "c" * 36)),
            EmbeddingRequest("m", ("d" * 80,))]
    vectors = np.arange(4 * 3, dtype=np.float32).reshape(4, 3)
    parts = split_response(EmbeddingResponse("up", vectors, 17), reqs)
    assert [p.vectors.tolist() for p in parts] == [vectors[0:1].tolist(), vectors[1:3].tolist(), vectors[3:4].tolist()]
    assert sum(p.input_tokens or 0 for p in parts) == 17
    # estimates 10, 1 + 9, 20: shares 17 * (10, 10, 20) / 40 = 4.25, 4.25, 8.5 -> 4, 4, 9
    assert [p.input_tokens for p in parts] == [4, 4, 9]


def test_split_without_reported_usage_leaves_each_caller_to_its_estimate() -> None:
    reqs = [EmbeddingRequest("m", ("a",)), EmbeddingRequest("m", ("b",))]
    parts = split_response(EmbeddingResponse("up", np.zeros((2, 4), np.float32), None), reqs)
    assert [p.input_tokens for p in parts] == [None, None]


def test_an_answer_of_the_wrong_size_is_the_upstream_fault() -> None:
    reqs = [EmbeddingRequest("m", ("a",)), EmbeddingRequest("m", ("b",))]
    with pytest.raises(UpstreamError):
        split_response(EmbeddingResponse("up", np.zeros((3, 4), np.float32), 3), reqs)


def test_a_split_renders_what_the_caller_alone_would_get() -> None:
    texts = [("alpha beta",), ("gamma", "delta epsilon")]
    reqs = [EmbeddingRequest("m", t, fmt) for t, fmt in zip(texts, ("float", "base64"), strict=True)]
    vectors = np.random.default_rng(1).standard_normal((3, 8)).astype(np.float32)
    parts = split_response(EmbeddingResponse("up", vectors, 5), reqs)
    for req, part, rows in zip(reqs, parts, (vectors[:1], vectors[1:]), strict=True):
        body = embeddings.render_response("openai", part, model="m", req=req)
        back = embeddings.parse_openai_response(body)
        assert np.array_equal(back.vectors, rows)


@given(st.integers(0, 10_000), st.lists(st.integers(0, 500), min_size=1, max_size=40))
def test_shares_sum_to_the_total_and_follow_the_weights(total: int, weights: list[int]) -> None:
    shares = share_tokens(total, weights)
    assert sum(shares) == total and len(shares) == len(weights) and min(shares) >= 0
    wsum = sum(weights)
    if wsum:
        assert all(abs(s - total * w / wsum) < 1 for s, w in zip(shares, weights, strict=True))
