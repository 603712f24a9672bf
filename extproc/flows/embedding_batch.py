"""Embeddings batched across callers (docs/batching.md "Embeddings"): which calls may merge, and the
leader's call of its own when the merged call was refused.

The queue and window are the image batcher's (`extproc/vision/batching.py`): a batch's first member
leads it, its ext_proc stream carries the merged inputs upstream through Envoy, and every other
member is answered from the split reply. A refused merged call (an upstream 4xx: someone's input was
bad) must fail nobody else: the members make their own calls through their own streams, and the
leader, whose stream already spent its upstream call, makes its own straight at the deployment.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import aiohttp

from adapters.embeddings import EmbeddingRequest
from adapters.embeddings.batch import merge_key
from adapters.internal import UpstreamRequest
from contracts.config import Deployment, ModelConfig
from extproc.telemetry.warmup import ssl_context
from extproc.vision.batching import BatchKey, BatchPolicy

log = logging.getLogger("modelyard.embeddings")

DATATYPE = "embedding"  # a text batch's key: rows are inputs, not tensors


@dataclass(frozen=True, slots=True)
class TextJob:
    """What one caller adds to a merged call: its inputs, in order."""

    request: EmbeddingRequest


def batch_policy(model: ModelConfig, dep: Deployment, *, deferred: bool) -> BatchPolicy | None:
    """The model's batching, or None: it does not batch (or this call is accepted for later)."""
    cfg = model.batching
    if cfg is None or not cfg.enabled or deferred:
        return None
    return BatchPolicy.from_config(cfg, len(dep.endpoints))


def batch_key(model: ModelConfig, dep: Deployment, req: EmbeddingRequest) -> BatchKey:
    return BatchKey(model.name, dep.cluster, (), DATATYPE, merge_key(req))


def refused(status: int) -> bool:
    """A merged call the upstream refused for its contents: each member's own call may well pass.
    429 and 5xx are the upstream's state, not an input's: those answers stand."""
    return 400 <= status < 500 and status not in (408, 429)


async def call_alone(dep: Deployment, up: UpstreamRequest, endpoint: str) -> tuple[int, bytes]:
    """One caller's own request, straight at an endpoint of the deployment (status, body); a
    transport failure is a 502 the caller reads in its own shape."""
    url = f"{'https' if dep.tls else 'http'}://{endpoint}{up.path}"
    timeout = aiohttp.ClientTimeout(total=dep.timeout_ms / 1000)
    try:
        async with aiohttp.ClientSession(timeout=timeout) as http, http.post(
                url, data=up.body, ssl=ssl_context(dep), headers={**up.headers, "content-type": "application/json"}) as r:
            return r.status, await r.read()
    except (TimeoutError, aiohttp.ClientError, OSError) as e:
        log.warning("embeddings: own call at %s after a refused batch failed (%s)", dep.cluster, type(e).__name__)
        return 502, b'{"error": {"message": "upstream unreachable"}}'
