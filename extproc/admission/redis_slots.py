"""`max_inflight` across replicas: slot leases in Redis, one sorted set per deployment.

A slot is a member (`<replica id>:<n>`) scored with its lease's expiry (Redis time, ms). Taking
one is a Lua script: drop expired leases, then add ours if fewer than `max_inflight` remain, so
the bound holds across every replica sharing the Redis. The holder renews its leases every
`lease_s / 3`; a replica that dies stops renewing and its slots come back within `lease_s`.
A Redis that does not answer fails open to this process's own bound (the queue in front of the
slots still holds), logged: a limit store going dark must not take the gateway down.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import uuid
from collections.abc import Iterable

log = logging.getLogger("modelyard.slots")

# KEYS[1]: the deployment's set. ARGV: limit, lease ms, member.
_TAKE = r"""
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
if redis.call('ZCARD', KEYS[1]) >= tonumber(ARGV[1]) then return 0 end
redis.call('ZADD', KEYS[1], now + tonumber(ARGV[2]), ARGV[3])
redis.call('PEXPIRE', KEYS[1], tonumber(ARGV[2]) * 2)
return 1
"""
# KEYS: sets; ARGV: lease ms, then per key one member. Renews the leases still there (XX).
_RENEW = r"""
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
for i = 1, #KEYS do
  redis.call('ZADD', KEYS[i], 'XX', now + tonumber(ARGV[1]), ARGV[i + 1])
  redis.call('PEXPIRE', KEYS[i], tonumber(ARGV[1]) * 2)
end
return 1
"""


class RedisSlots:
    """This replica's slot leases: `take` (async), `give` (returns at once), renewed in the background."""

    def __init__(self, url: str, clusters: Iterable[str], *, prefix: str = "{my}", lease_s: float = 15.0,
                 timeout_ms: int = 200) -> None:
        t = timeout_ms / 1000
        import redis.asyncio as aioredis  # only with the Redis backend: every extproc start would pay its import

        self._r = aioredis.from_url(url, socket_timeout=t, socket_connect_timeout=t)
        self._prefix = prefix
        self._clusters = set(clusters)
        self.lease_ms = max(1, round(lease_s * 1000))
        self._id = f"{os.getpid()}-{uuid.uuid4().hex[:8]}"
        self._seq = itertools.count()
        self._held: dict[str, list[str]] = {c: [] for c in self._clusters}
        self._take = self._r.register_script(_TAKE)
        self._renew = self._r.register_script(_RENEW)
        self._renewer: asyncio.Task[None] | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._warned = False

    def __contains__(self, cluster: str) -> bool:
        return cluster in self._clusters

    def track(self, clusters: Iterable[str]) -> None:
        """A reload's set of limited deployments: new ones join; removed ones keep their leases until given back."""
        for c in clusters:
            self._clusters.add(c)
            self._held.setdefault(c, [])

    def _key(self, cluster: str) -> str:
        return f"{self._prefix}:slots:{cluster}"

    async def take(self, cluster: str, limit: int) -> bool:
        if self._renewer is None:
            self._renewer = asyncio.get_running_loop().create_task(self._renew_forever())
        member = f"{self._id}:{next(self._seq)}"
        try:
            ok = bool(await self._take(keys=[self._key(cluster)], args=[limit, self.lease_ms, member]))
        except Exception as e:  # noqa: BLE001 - Redis trouble fails open to this process's own bound
            self._failed(e)
            self._held[cluster].append("")  # a local-only slot: nothing to hand back in Redis
            return True
        if ok:
            self._held[cluster].append(member)
        return ok

    def give(self, cluster: str) -> None:
        held = self._held[cluster]
        if not held:
            return
        member = held.pop()
        if not member:
            return
        task = asyncio.get_running_loop().create_task(self._zrem(cluster, member))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _zrem(self, cluster: str, member: str) -> None:
        try:
            await self._r.zrem(self._key(cluster), member)
        except Exception as e:  # noqa: BLE001 - the lease expires on its own
            self._failed(e)

    async def _renew_forever(self) -> None:
        while True:
            await asyncio.sleep(self.lease_ms / 3000)
            keys, members = [], []
            for cluster, held in self._held.items():
                for m in held:
                    if m:
                        keys.append(self._key(cluster))
                        members.append(m)
            if not keys:
                continue
            try:
                await self._renew(keys=keys, args=[self.lease_ms, *members])
                self._warned = False
            except Exception as e:  # noqa: BLE001 - a missed renewal only shortens a lease
                self._failed(e)

    def held(self, cluster: str) -> int:
        return len(self._held[cluster])

    def _failed(self, e: BaseException) -> None:
        if not self._warned:
            self._warned = True
            log.warning("max_inflight: Redis slot call failed (%s: %s); this process's own bound holds until "
                        "it answers", type(e).__name__, e)

    async def aclose(self) -> None:
        if self._renewer is not None:
            self._renewer.cancel()
            await asyncio.gather(self._renewer, return_exceptions=True)
        for cluster, held in self._held.items():  # hand back what is still held: the next owner need not wait
            for _ in range(len(held)):
                self.give(cluster)
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
        await self._r.aclose()
