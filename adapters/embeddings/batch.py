"""Embeddings of several callers as one upstream call: the merged request, and the merged answer
split back into each caller's own (pure; the batcher in extproc/vision/batching.py decides who merges).

Callers merge only when everything but their inputs matches (`merge_key`): the same vectors come
back as each would have got alone. Each caller's usage is its share of what the upstream reported,
in proportion to its inputs' estimates, the shares summing to the upstream's count exactly.
"""

from __future__ import annotations

from collections.abc import Sequence

from adapters.embeddings.wire import EmbeddingRequest, EmbeddingResponse, estimate_tokens
from adapters.fields import bad_upstream

# What must match for two requests to share one upstream call (the inputs are what differs).
MergeKey = tuple[int | None, str | None, str | None]


def merge_key(req: EmbeddingRequest) -> MergeKey:
    return req.dimensions, req.task_type, req.title


def merge_requests(reqs: Sequence[EmbeddingRequest]) -> EmbeddingRequest:
    """One request with every caller's inputs in order (a list, whatever each caller sent)."""
    first = reqs[0]
    if any(merge_key(r) != merge_key(first) for r in reqs):
        raise ValueError("requests that differ in more than their inputs do not merge")
    inputs = tuple(s for r in reqs for s in r.inputs)
    return EmbeddingRequest(first.model, inputs, "base64", first.dimensions, first.task_type, first.title)


def share_tokens(total: int, weights: Sequence[int]) -> list[int]:
    """`total` split in proportion to `weights` (largest remainders), summing to `total` exactly."""
    wsum = sum(weights)
    if wsum <= 0:
        return [total if i == 0 else 0 for i in range(len(weights))]
    shares = [total * w // wsum for w in weights]
    rest = total - sum(shares)
    by_remainder = sorted(range(len(weights)), key=lambda i: (-(total * weights[i] % wsum), i))
    for i in by_remainder[:rest]:
        shares[i] += 1
    return shares


def split_response(resp: EmbeddingResponse, reqs: Sequence[EmbeddingRequest]) -> list[EmbeddingResponse]:
    """Each caller's rows of the merged answer, in order, with its share of the reported usage
    (None where the upstream reported none: each caller's flow meters its own estimate)."""
    rows = [len(r.inputs) for r in reqs]
    if len(resp.vectors) != sum(rows):
        raise bad_upstream(f"{len(resp.vectors)} embeddings for {sum(rows)} merged inputs")
    tokens: list[int | None] = [None] * len(reqs)
    if resp.input_tokens is not None:
        tokens = list(share_tokens(resp.input_tokens, [estimate_tokens(r) for r in reqs]))
    out = []
    start = 0
    for n, t in zip(rows, tokens, strict=True):
        out.append(EmbeddingResponse(resp.model, resp.vectors[start:start + n], t))
        start += n
    return out
