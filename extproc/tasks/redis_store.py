"""Tasks in Redis, for replicas that share them: one key per task (its JSON document) and sorted
sets of ids: queued (by creation time), running (by lease expiry) and done (by completion time).
Every change is a WATCH/MULTI transaction around the same pure transition the SQLite store
applies, so two replicas never both take a task.

Persistence is Redis's own (AOF with `appendfsync everysec` or stricter is what "survives a
crash" needs; docs/tasks.md).
"""

from __future__ import annotations

import asyncio
import time

import redis.asyncio as aioredis
from redis.exceptions import WatchError

from extproc.tasks import state
from extproc.tasks.state import TaskRecord
from extproc.tasks.store import Transition

_CLAIM_SCAN = 16
_RETRIES = 8  # optimistic transactions lost to another replica before a call gives up for now


class RedisTaskStore:
    def __init__(self, url: str, prefix: str = "modelyard:tasks:") -> None:
        # Bounded: a store call sits inside an ext_proc message, which Envoy times out (10 s default).
        self._r = aioredis.Redis.from_url(url, socket_timeout=2.0, socket_connect_timeout=1.0)
        self._prefix = prefix
        self._queued = prefix + "queued"  # scored by created_at
        self._running = prefix + "running"  # scored by lease_until: expired ones were interrupted
        self._done = prefix + "done"  # finished ids, scored by completed_at (for the TTL purge)
        self._webhooks = prefix + "webhooks"  # finished ids whose webhook no receiver has taken yet

    def _key(self, task_id: str) -> str:
        return self._prefix + "task:" + task_id

    async def create(self, rec: TaskRecord) -> None:
        key = self._key(rec.id)
        async with self._r.pipeline(transaction=True) as p:
            await p.watch(key)
            if await p.exists(key):
                raise ValueError(f"task {rec.id} exists")
            p.multi()
            p.hset(key, mapping={"body": rec.request.body})
            self._put(p, rec)
            await p.execute()  # WatchError: someone created the same id meanwhile

    async def create_many(self, recs: list[TaskRecord]) -> None:
        for rec in recs:  # each its own transaction: a crash midway leaves lines no batch record names
            await self.create(rec)

    async def get_many(self, task_ids: list[str]) -> dict[str, TaskRecord]:
        found = await asyncio.gather(*(self.get(t) for t in task_ids))
        return {rec.id: rec for rec in found if rec is not None}

    async def get(self, task_id: str, *, with_body: bool = False) -> TaskRecord | None:
        fields = ["doc", "result", "body"] if with_body else ["doc", "result"]
        got = await self._r.hmget(self._key(task_id), fields)
        if not got or got[0] is None:
            return None
        return _record(got, with_body)

    async def update(self, task_id: str, change: Transition, *, with_body: bool = False) -> TaskRecord | None:
        key = self._key(task_id)
        fields = ["doc", "result", "body"] if with_body else ["doc", "result"]
        for _ in range(_RETRIES):
            async with self._r.pipeline(transaction=True) as p:
                try:
                    await p.watch(key)
                    got = await p.hmget(key, fields)
                    if not got or got[0] is None:
                        return None
                    new = change(_record(got, with_body))
                    if new is None:
                        return None
                    p.multi()
                    self._put(p, new)
                    await p.execute()
                    return new
                except WatchError:
                    continue
        raise RuntimeError(f"task {task_id}: too much contention to update")

    def _put(self, p: aioredis.client.Pipeline, rec: TaskRecord) -> None:
        """Everything but the request body, which never changes after `create`."""
        key = self._key(rec.id)
        p.hset(key, "doc", state.to_doc(rec))
        if rec.result is not None:
            p.hset(key, "result", rec.result)
        if rec.status == "queued":
            p.zrem(self._running, rec.id)
            p.zadd(self._queued, {rec.id: rec.created_at})
        elif rec.status == "running":
            p.zrem(self._queued, rec.id)
            p.zadd(self._running, {rec.id: rec.lease_until})
        else:
            p.zrem(self._queued, rec.id)
            p.zrem(self._running, rec.id)
            p.zadd(self._done, {rec.id: rec.completed_at or time.time()})
            if state.owes_webhook(rec):
                p.zadd(self._webhooks, {rec.id: rec.completed_at or time.time()})
            else:
                p.zrem(self._webhooks, rec.id)

    async def claim_next(self, now: float, owner: str, lease_s: float) -> TaskRecord | None:
        lapsed = _ids(await self._r.zrangebyscore(self._running, "-inf", f"({now}", start=0, num=_CLAIM_SCAN))
        for task_id in lapsed + _ids(await self._r.zrange(self._queued, 0, _CLAIM_SCAN - 1)):
            new = await self.update(task_id, lambda r: _claimed(r, now, owner, lease_s), with_body=True)
            if new is not None:
                return new
        return None

    async def purge(self, now: float, ttl_s: float) -> int:
        ids = _ids(await self._r.zrangebyscore(self._done, 0, now - ttl_s))
        if not ids:
            return 0
        async with self._r.pipeline(transaction=True) as p:
            p.delete(*[self._key(i) for i in ids])
            p.zrem(self._done, *ids)
            p.zrem(self._webhooks, *ids)
            await p.execute()
        return len(ids)

    async def owed_webhooks(self, limit: int) -> list[TaskRecord]:
        out = []
        for task_id in _ids(await self._r.zrange(self._webhooks, 0, limit - 1)):
            rec = await self.get(task_id)
            if rec is not None:
                out.append(rec)
        return out

    async def close(self) -> None:
        await self._r.aclose()


def _claimed(rec: TaskRecord, now: float, owner: str, lease_s: float) -> TaskRecord | None:
    new = state.claim(rec, now, owner, lease_s)
    return None if new is rec else new


def _ids(raw: object) -> list[str]:
    items = raw if isinstance(raw, list) else []
    return [i.decode() if isinstance(i, bytes) else str(i) for i in items]


def _record(got: list, with_body: bool) -> TaskRecord:
    """HMGET doc, result[, body] (bytes: the client does not decode) as a record."""
    doc, result = got[0], got[1]
    body = got[2] if with_body else None
    return state.from_doc(doc, bytes(body) if body is not None else None, bytes(result) if result is not None else None)
