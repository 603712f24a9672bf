"""The Gateway's response-cache part: each model's policy, the store, and one request's cache step
(`CacheStep`): the key and verdict at the request-body step, the entry kept at the response's end.

A model without a policy never builds a step: its calls do no cache work at all.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass

import orjson

from adapters.internal import ChatRequest, ChatResponse
from adapters.json_types import JSONObject
from contracts.config import GatewayConfig
from contracts.config.response_cache import CachePolicy
from extproc.cache import entry as entry_codec
from extproc.cache.entry import Entry
from extproc.cache.key import extras, request_key
from extproc.cache.lookup import Probe, ResponseLookup
from extproc.cache.metrics import LOOKUP, STORED, result_series
from extproc.cache.policy import CACHE_HEADER, CallerControl, Verdict, fresh, parse_cache_control, refusal, scope_id

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

    @property
    def header(self) -> tuple[str, str]:
        return (CACHE_HEADER, self.verdict)

    @property
    def writes(self) -> bool:
        return self.probe is not None and self.control is not None and self.control.write


class ResponseCache:
    def __init__(self, store: ResponseLookup, store_name: str, lookup_timeout_s: float) -> None:
        self.store = store
        self.store_name = store_name
        self.timeout_s = lookup_timeout_s
        self._lookup = LOOKUP.labels(store_name)

    @classmethod
    def from_config(cls, config: GatewayConfig) -> ResponseCache | None:
        """None unless some model has a policy (nothing opened, nothing imported for Redis)."""
        if not any(m.cache is not None for m in config.models):
            return None
        for m in config.models:  # every outcome's series from the start, at 0: rate() sees the first one
            if m.cache is not None:
                for result in ("hit", "miss", "bypass"):
                    result_series(m.name, result)
        rc = config.response_cache
        store: ResponseLookup
        if rc.store == "redis":
            from extproc.cache.redis_store import RedisResponseStore
            store = RedisResponseStore(rc.redis_url, rc.redis_prefix, rc.max_bytes)
        else:
            from extproc.cache.sqlite_store import SqliteResponseStore
            store = SqliteResponseStore(rc.sqlite_path, rc.max_bytes)
        return cls(store, rc.store, rc.lookup_timeout_ms / 1000)

    async def begin(self, policy: CachePolicy, model: str, tenant: str, key_id: str | None, protocol: str,
                    req: ChatRequest, body: bytes, cache_control: str | None) -> CacheStep:
        """The step for a request routed to `model`: bypass, miss, or hit (with the stored answer)."""
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
        return self._counted(step)

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
        self.store.put(Entry(step.probe.key, step.tenant, step.model, now, now + step.policy.ttl_s, body))
        STORED.labels(step.model).inc()

    @staticmethod
    def _counted(step: CacheStep) -> CacheStep:
        result_series(step.model, step.verdict).inc()
        return step

    async def close(self) -> None:
        await self.store.close()
