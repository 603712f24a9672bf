"""The shared store: Redis, for replicas that serve one model's cache together.

One hash per entry (`<prefix>e:<key>`: body, tenant, model, stored_at, size) with Redis's own
expiry at the entry's TTL; a sorted set of keys by expiry and a hash of sizes keep the store's
byte bound: past `max_bytes` the entries closest to expiry go first (expired ones are already
gone). Puts are tasks on the loop (the async client): the request never waits for one.

Semantic entries: the vector and partition are fields of the entry's hash (so they expire and are
evicted with it), and each put is announced on a stream (`<prefix>vectors`: key, partition, expiry,
vector) that every replica's index reads from where it left off; a replica starting reads the live
entries' vectors from their hashes first. Chosen over keeping the matrix in Redis and fetching it
per lookup: bench/bench_semantic.py's `redis-fetch` rows (docs/cache.md).
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

import redis.asyncio as aioredis
from redis.exceptions import RedisError

from extproc.cache.entry import Entry
from extproc.cache.lookup import Probe, StoreStats, VectorRow

log = logging.getLogger("modelyard.rcache")
_EVICT_BATCH = 64
# The announcements a replica may lag behind by before it misses some (a miss, never a wrong answer).
_STREAM_LEN = 100_000
_READ_BATCH = 5_000


class RedisResponseStore:
    def __init__(self, url: str, prefix: str, max_bytes: int) -> None:
        # Any: redis-py types every reply as a union of str and bytes; these are bytes (no decode_responses).
        self._r: Any = aioredis.Redis.from_url(url, socket_timeout=2.0, socket_connect_timeout=1.0)
        self._prefix = prefix
        self._index = prefix + "index"  # key -> expires_at
        self._sizes = prefix + "sizes"  # key -> stored bytes
        self._stream = prefix + "vectors"  # semantic puts, in order
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
        fields: dict[str, bytes | str] = {"body": e.body, "tenant": e.tenant, "model": e.model,
                                          "stored_at": repr(e.stored_at), "expires_at": repr(e.expires_at)}
        if e.vector:
            fields |= {"partition": e.partition, "vector": e.vector}
        try:
            async with self._r.pipeline(transaction=True) as p:
                p.delete(self._key(e.key))  # an exact answer replacing a semantic one leaves no stale vector
                p.hset(self._key(e.key), mapping=fields)
                p.pexpire(self._key(e.key), ttl_ms)
                p.zadd(self._index, {e.key: e.expires_at})
                p.hset(self._sizes, e.key, e.size)
                if e.vector:
                    p.xadd(self._stream, {"key": e.key, "partition": e.partition, "expires_at": repr(e.expires_at),
                                          "vector": e.vector}, maxlen=_STREAM_LEN, approximate=True)
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

    async def vectors_since(self, cursor: str | None, now: float) -> tuple[list[VectorRow], str]:
        if cursor is None:  # a start: every live entry's vector, then the stream from before that read
            last = await self._r.xrevrange(self._stream, count=1)
            cursor = last[0][0].decode() if last else "0-0"
            return await self._live_vectors(now), cursor
        got = await self._r.xread({self._stream: cursor}, count=_READ_BATCH)
        rows: list[VectorRow] = []
        for _, messages in got:
            for msg_id, f in messages:
                cursor = msg_id.decode()
                expires_at = float(f[b"expires_at"])
                if expires_at > now:
                    rows.append(VectorRow(f[b"key"].decode(), f[b"partition"].decode(), expires_at, bytes(f[b"vector"])))
        return rows, cursor

    async def _live_vectors(self, now: float) -> list[VectorRow]:
        keys = await self._r.zrangebyscore(self._index, now, "+inf")
        rows: list[VectorRow] = []
        for i in range(0, len(keys), _READ_BATCH):
            chunk = keys[i:i + _READ_BATCH]
            async with self._r.pipeline(transaction=False) as p:
                for k in chunk:
                    p.hmget(self._key(k.decode()), ["partition", "vector", "expires_at"])
                got = await p.execute()
            rows += [VectorRow(k.decode(), part.decode(), float(exp), bytes(vec))
                     for k, (part, vec, exp) in zip(chunk, got, strict=True) if vec is not None and exp is not None]
        return rows

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
