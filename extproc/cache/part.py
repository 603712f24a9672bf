"""The Gateway's response-cache part: each model's policy, the store, and one request's cache step
(`CacheStep`): the key and verdict at the request-body step, the entry kept at the response's end.

A model without a policy never builds a step: its calls do no cache work at all. A `mode: semantic`
model's step also embeds its last user message (after an exact miss), asks the process's
`SemanticIndex` for the nearest stored prompt of the same partition, and keeps the vector with the
answer it stores.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass

import numpy as np
import orjson

from adapters.internal import ChatRequest, ChatResponse
from adapters.json_types import JSONObject
from contracts.config import GatewayConfig, ModelConfig
from contracts.config.response_cache import CachePolicy
from extproc.cache import entry as entry_codec
from extproc.cache.embedder import Embedder
from extproc.cache.entry import Entry
from extproc.cache.key import extras, request_key
from extproc.cache.lookup import Probe, ResponseLookup
from extproc.cache.metrics import EMBED, EMBED_FAILURES, LOOKUP, SCORE, STORED, result_series
from extproc.cache.policy import CACHE_HEADER, CallerControl, Verdict, fresh, parse_cache_control, refusal, scope_id
from extproc.cache.semantic import SemanticIndex
from extproc.cache.semantic_key import SemanticProbe, semantic_probe

log = logging.getLogger("modelyard.rcache")


@dataclass(slots=True)
class CacheStep:
    """One request's cache work: `verdict` goes on the answer's `x-modelyard-cache`."""

    policy: CachePolicy
    model: str
    tenant: str
    verdict: Verdict
    probe: Probe | None = None  # None: bypass (nothing read, nothing written)
    control: CallerControl | None = None
    hit: ChatResponse | None = None
    semantic: SemanticProbe | None = None  # a semantic model's partition and text, once embedded
    vector: np.ndarray | None = None
    score: float = 0.0  # a semantic hit's similarity

    @property
    def header(self) -> tuple[str, str]:
        if self.verdict == "semantic":
            return (CACHE_HEADER, f"semantic;score={self.score:.2f}")
        return (CACHE_HEADER, self.verdict)

    @property
    def writes(self) -> bool:
        return self.probe is not None and self.control is not None and self.control.write


class ResponseCache:
    def __init__(self, store: ResponseLookup, store_name: str, lookup_timeout_s: float,
                 partition_rows: int = 20_000) -> None:
        self.store = store
        self.partition_rows = partition_rows
        self.store_name = store_name
        self.timeout_s = lookup_timeout_s
        self._lookup = LOOKUP.labels(store_name)
        self._semantic: SemanticIndex | None = None  # built on the first semantic model's first call
        self._embedders: dict[tuple[str, int | None, float], tuple[ModelConfig, Embedder]] = {}
        self._closing: set[asyncio.Task[None]] = set()

    @classmethod
    def from_config(cls, config: GatewayConfig) -> ResponseCache | None:
        """None unless some model has a policy (nothing opened, nothing imported for Redis)."""
        if not any(m.cache is not None for m in config.models):
            return None
        for m in config.models:  # every outcome's series from the start, at 0: rate() sees the first one
            if m.cache is not None:
                for result in ("hit", "miss", "bypass", *(("semantic",) if m.cache.mode == "semantic" else ())):
                    result_series(m.name, result)
        rc = config.response_cache
        store: ResponseLookup
        if rc.store == "redis":
            from extproc.cache.redis_store import RedisResponseStore
            store = RedisResponseStore(rc.redis_url, rc.redis_prefix, rc.max_bytes)
        else:
            from extproc.cache.sqlite_store import SqliteResponseStore
            store = SqliteResponseStore(rc.sqlite_path, rc.max_bytes)
        cache = cls(store, rc.store, rc.lookup_timeout_ms / 1000, rc.semantic_partition_rows)
        if any(m.cache is not None and m.cache.mode == "semantic" for m in config.models):
            cache._semantic = SemanticIndex(store, rc.semantic_partition_rows)
        return cache

    def start(self) -> None:
        """The semantic index's rebuild and refresh, in the background (the loop is running)."""
        if self._semantic is not None:
            self._semantic.start()

    def _semantic_index(self) -> SemanticIndex:
        if self._semantic is None:  # a model turned semantic by a reload
            self._semantic = SemanticIndex(self.store, self.partition_rows)
        self._semantic.start()
        return self._semantic

    def _embedder(self, policy: CachePolicy, model: ModelConfig) -> Embedder:
        """One per embedding model and settings; a reload that changed the model's config gets a new one."""
        key = (model.name, policy.embedding_dimensions, policy.embedding_timeout_ms)
        held = self._embedders.get(key)
        if held is None or held[0] is not model:
            if held is not None:  # the replaced one's session closes in the background (a ref kept till then)
                task = asyncio.get_running_loop().create_task(held[1].close())
                self._closing.add(task)
                task.add_done_callback(self._closing.discard)
            held = self._embedders[key] = (model, Embedder(model, policy.embedding_dimensions,
                                                           policy.embedding_timeout_ms / 1000))
        return held[1]

    async def begin(self, policy: CachePolicy, model: str, tenant: str, key_id: str | None, protocol: str,
                    req: ChatRequest, body: bytes, cache_control: str | None,
                    embedding_model: ModelConfig | None = None) -> CacheStep:
        """The step for a request routed to `model`: bypass, miss, or hit (with the stored answer);
        a semantic policy's `embedding_model` is the config's model its `embedding_model` names."""
        control = parse_cache_control(cache_control)
        scope = scope_id(policy, tenant, key_id)
        if scope is None or not (control.read or control.write):
            return self._counted(CacheStep(policy, model, tenant, "bypass"))
        try:
            raw = orjson.loads(body)
        except orjson.JSONDecodeError:
            raw = None
        extra: JSONObject = extras(protocol, raw) if isinstance(raw, dict) else {}
        if refusal(policy, req, extra) is not None:
            return self._counted(CacheStep(policy, model, tenant, "bypass"))
        probe = Probe(request_key(req, model=model, scope_id=scope, extra=extra), model, scope,
                      control.max_age_s, req)
        step = CacheStep(policy, model, tenant, "miss", probe, control)
        if control.read:
            step.hit = await self._read(probe)
            if step.hit is not None:
                step.verdict = "hit"
        if step.hit is None and policy.mode == "semantic" and embedding_model is not None:
            found = semantic_probe(req, model=model, scope_id=scope, extra=extra, embedder=embedding_model.name,
                                   dimensions=policy.embedding_dimensions)
            if found is not None:
                await self._semantic_lookup(step, found, self._embedder(policy, embedding_model))
        return self._counted(step)

    async def _semantic_lookup(self, step: CacheStep, found: SemanticProbe, embedder: Embedder) -> None:
        """Embed the text; with a stored prompt of the partition at least `threshold` alike, its
        answer is the hit. The vector stays on the step: a miss's answer is stored with it."""
        started = time.perf_counter()
        vec = await embedder.embed(found.text)
        EMBED.labels(embedder.model.name).observe(time.perf_counter() - started)
        if vec is None:
            EMBED_FAILURES.labels(embedder.model.name).inc()
            return
        step.semantic, step.vector = found, vec
        assert step.control is not None and step.probe is not None
        if not step.control.read:
            return
        index = self._semantic_index()
        try:  # the writer thread may be busy with a rebuild's batch: a search that waits past the bound is a miss
            match = await asyncio.wait_for(index.nearest(found.partition, vec, time.time()), self.timeout_s)
        except TimeoutError:
            log.warning("semantic cache: index search over %.0f ms: a miss", self.timeout_s * 1000)
            return
        if match is None:
            return
        SCORE.labels(step.model).observe(match.score)
        if match.score < step.policy.similarity:
            return
        probe = Probe(match.key, step.model, step.probe.scope, step.probe.max_age_s)
        hit = await self._read(probe)
        if hit is None:  # its entry is gone (evicted, purged) or older than the caller accepts
            index.forget(match.key)
            return
        step.hit, step.verdict, step.score = hit, "semantic", match.score

    async def _read(self, probe: Probe) -> ChatResponse | None:
        started = time.perf_counter()
        try:
            found = await asyncio.wait_for(self.store.get(probe, time.time()), self.timeout_s)
        except Exception as e:  # a store away (or slow: the timeout) is a miss, never a failed call
            log.warning("response cache: lookup failed (%s): answering upstream", type(e).__name__)
            found = None
        self._lookup.observe(time.perf_counter() - started)
        if found is None or not fresh(found.stored_at, found.expires_at, time.time(), probe.max_age_s):
            return None
        try:
            return entry_codec.decode(found.body)
        except (ValueError, KeyError, TypeError):
            return None  # an entry of another version: a miss, overwritten by this call's answer

    def keep(self, step: CacheStep, resp: ChatResponse) -> None:
        """A whole answer seen: queue it for the store (never an error, nor one over the bound)."""
        if not step.writes or resp.finish_reason == "error" or resp.untranslatable is not None:
            return
        assert step.probe is not None
        body = entry_codec.encode(resp)
        if len(body) > step.policy.max_entry_bytes:
            return
        now = time.time()
        expires_at = now + step.policy.ttl_s
        if step.semantic is not None and step.vector is not None:
            vec = np.ascontiguousarray(step.vector, np.float32)
            self.store.put(Entry(step.probe.key, step.tenant, step.model, now, expires_at, body,
                                 step.semantic.partition, vec.tobytes()))
            self._semantic_index().add(step.semantic.partition, step.probe.key, vec, expires_at)
        else:
            self.store.put(Entry(step.probe.key, step.tenant, step.model, now, expires_at, body))
        STORED.labels(step.model).inc()

    @staticmethod
    def _counted(step: CacheStep) -> CacheStep:
        result_series(step.model, step.verdict).inc()
        return step

    async def close(self) -> None:
        if self._semantic is not None:
            await self._semantic.close()
        for _, embedder in self._embedders.values():
            await embedder.close()
        await self.store.close()
