"""The shared store: Redis, for replicas that serve one model's cache together.

One hash per entry (`<prefix>e:<key>`: body, tenant, model, stored_at, size) with Redis's own
expiry at the entry's TTL; a sorted set of keys by expiry and a hash of sizes keep the store's
byte bound: past `max_bytes` the entries closest to expiry go first (expired ones are already
gone). Puts are tasks on the loop (the async client): the request never waits for one.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

import redis.asyncio as aioredis
from redis.exceptions import RedisError

from extproc.cache.entry import Entry
from extproc.cache.lookup import Probe, StoreStats

log = logging.getLogger("modelyard.rcache")
_EVICT_BATCH = 64


class RedisResponseStore:
    def __init__(self, url: str, prefix: str, max_bytes: int) -> None:
        # Any: redis-py types every reply as a union of str and bytes; these are bytes (no decode_responses).
        self._r: Any = aioredis.Redis.from_url(url, socket_timeout=2.0, socket_connect_timeout=1.0)
        self._prefix = prefix
        self._index = prefix + "index"  # key -> expires_at
        self._sizes = prefix + "sizes"  # key -> stored bytes
        self.max_bytes = max_bytes
        self._pending: set[asyncio.Task[None]] = set()

    def _key(self, key: str) -> str:
        return self._prefix + "e:" + key

    async def get(self, probe: Probe, now: float) -> Entry | None:
        got = await self._r.hmget(self._key(probe.key), ["body", "tenant", "model", "stored_at", "expires_at"])
        if got[0] is None:
            return None
        return Entry(probe.key, got[1].decode(), got[2].decode(), float(got[3]), float(got[4]), bytes(got[0]))

    def put(self, entry: Entry) -> None:
        task = asyncio.get_running_loop().create_task(self._put(entry))
        self._pending.add(task)
        task.add_done_callback(self._pending.discard)

    async def _put(self, e: Entry) -> None:
        ttl_ms = max(1, int((e.expires_at - time.time()) * 1000))
        try:
            async with self._r.pipeline(transaction=True) as p:
                p.hset(self._key(e.key), mapping={"body": e.body, "tenant": e.tenant, "model": e.model,
                                                  "stored_at": repr(e.stored_at), "expires_at": repr(e.expires_at)})
                p.pexpire(self._key(e.key), ttl_ms)
                p.zadd(self._index, {e.key: e.expires_at})
                p.hset(self._sizes, e.key, len(e.body))
                await p.execute()
            await self._evict()
        except RedisError as err:
            log.warning("response cache: Redis put failed: %s", err)

    async def _evict(self) -> None:
        now = time.time()
        expired = await self._r.zrangebyscore(self._index, "-inf", now)
        if expired:
            await self._forget(expired)
        while True:
            sizes = await self._r.hvals(self._sizes)
            over = sum(int(s) for s in sizes) - self.max_bytes
            if over <= 0:
                return
            oldest = await self._r.zrange(self._index, 0, _EVICT_BATCH - 1)
            if not oldest:
                return
            await self._forget(oldest)

    async def _forget(self, keys: list[bytes]) -> None:
        async with self._r.pipeline(transaction=True) as p:
            p.delete(*[self._key(k.decode()) for k in keys])
            p.zrem(self._index, *keys)
            p.hdel(self._sizes, *keys)
            await p.execute()

    async def _live(self) -> list[tuple[bytes, bytes | None, bytes | None, bytes | None]]:
        keys = await self._r.zrangebyscore(self._index, time.time(), "+inf")
        async with self._r.pipeline(transaction=False) as p:
            for k in keys:
                p.hmget(self._key(k.decode()), ["tenant", "model"])
                p.hget(self._sizes, k)
            got = await p.execute()
        return [(k, got[2 * i][0], got[2 * i][1], got[2 * i + 1]) for i, k in enumerate(keys)]

    async def stats(self) -> StoreStats:
        by_model: dict[str, int] = {}
        by_tenant: dict[str, int] = {}
        entries = size = 0
        for _, tenant, model, nbytes in await self._live():
            if tenant is None or model is None:
                continue
            entries += 1
            size += int(nbytes or 0)
            by_model[model.decode()] = by_model.get(model.decode(), 0) + 1
            by_tenant[tenant.decode()] = by_tenant.get(tenant.decode(), 0) + 1
        return StoreStats(entries, size, self.max_bytes, by_model, by_tenant)

    async def purge(self, tenant: str | None = None, model: str | None = None) -> int:
        doomed = [k for k, t, m, _ in await self._live()
                  if t is not None and m is not None and (tenant is None or t.decode() == tenant)
                  and (model is None or m.decode() == model)]
        if doomed:
            await self._forget(doomed)
        return len(doomed)

    async def flush(self) -> None:
        """Wait for the puts under way (tests)."""
        if self._pending:
            await asyncio.gather(*self._pending, return_exceptions=True)

    async def close(self) -> None:
        await self.flush()
        await self._r.aclose()
