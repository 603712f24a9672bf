"""Buckets in Redis: one Lua script per decision, every key of the decision in one round trip.

Keys are `<prefix>:<scope>:<value>:<unit>` with the prefix a hash tag (default `{my}`), so all of
them hash to one slot and a multi-key script also runs on Redis Cluster. Time comes from Redis
(`TIME`), so replicas with skewed clocks still share one timeline.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import NoScriptError

from . import bucket
from .backend import BucketView, TakeResult
from .rules import Charge

# KEYS: bucket keys. ARGV[1]: 'take' | 'adjust'; ARGV[2]: now in us or '' for Redis TIME;
# then per key: rate_milli, burst_nano, amount_nano (cost to take, or delta to add).
# Replies: {allowed, level_1, ..., level_n} with levels as decimal strings (exact integers).
LUA = r"""
local mode = ARGV[1]
local now
if ARGV[2] ~= '' then
  now = tonumber(ARGV[2])
else
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
end
local n = #KEYS
local levels, stamps = {}, {}
local ok = 1
for i = 1, n do
  local rate = tonumber(ARGV[3 * i])
  local burst = tonumber(ARGV[3 * i + 1])
  local amt = tonumber(ARGV[3 * i + 2])
  local v = redis.call('HMGET', KEYS[i], 'l', 't')
  local level, ts
  if v[1] then
    level = tonumber(v[1]); ts = tonumber(v[2])
  else
    level = burst; ts = now
  end
  local dt = now - ts
  if dt > 0 then
    local room = burst - level
    if room <= 0 or rate * dt >= room then level = burst else level = level + rate * dt end
    ts = now
  elseif level > burst then
    level = burst
  end
  levels[i] = level; stamps[i] = ts
  if mode == 'take' and level < amt then ok = 0 end
end
local out = {ok}
for i = 1, n do
  local rate = tonumber(ARGV[3 * i])
  local burst = tonumber(ARGV[3 * i + 1])
  local amt = tonumber(ARGV[3 * i + 2])
  local level = levels[i]
  if mode == 'take' then
    if ok == 1 then level = level - amt end
  else
    level = level + amt
    if level > burst then level = burst end
    if level < -burst then level = -burst end
  end
  local s = string.format('%.0f', level)
  if mode ~= 'take' or ok == 1 then
    redis.call('HSET', KEYS[i], 'l', s, 't', string.format('%.0f', stamps[i]))
    redis.call('PEXPIRE', KEYS[i], string.format('%.0f', math.ceil((burst - level) / rate / 1000) + 60000))
  end
  out[i + 1] = s
end
return out
"""


class RedisBuckets:
    """The Redis bucket store; raises Redis/OS errors to the caller, which applies the policy."""

    def __init__(self, url: str, timeout_ms: int = 50, key_prefix: str = "{my}") -> None:
        t = timeout_ms / 1000
        self._r = aioredis.from_url(
            url,
            socket_timeout=t,
            socket_connect_timeout=t,
            # One immediate reconnect on a dropped connection (a pooled socket that went stale when
            # Redis restarted); a Redis that is really down fails that too, fast, and timeouts are
            # never retried: the failure policy decides, not hidden retries.
            retry=Retry(NoBackoff(), 1, supported_errors=(RedisConnectionError,)),
            decode_responses=False,
        )
        self._prefix = key_prefix
        self._sha: str | None = None
        self.now_override_us: int | None = None  # tests pin the clock; production uses Redis TIME
        # Decisions made in the same event-loop tick go out as one pipeline (one round trip).
        self._pending: list[tuple[list[str], list[str], asyncio.Future]] = []
        self._flush_scheduled = False
        self._tasks: set[asyncio.Task] = set()

    async def _eval(self, keys: list[str], args: list[str]) -> list[bytes]:
        if self._sha is None:
            self._sha = await self._r.script_load(LUA)
        try:
            return await self._r.evalsha(self._sha, len(keys), *keys, *args)
        except NoScriptError:
            # Redis restarted or flushed its script cache: load again and retry once.
            self._sha = await self._r.script_load(LUA)
            return await self._r.evalsha(self._sha, len(keys), *keys, *args)

    async def _submit(self, keys: list[str], args: list[str]) -> list[bytes]:
        fut = asyncio.get_running_loop().create_future()
        self._pending.append((keys, args, fut))
        if not self._flush_scheduled:
            self._flush_scheduled = True
            asyncio.get_running_loop().call_soon(self._start_flush)
        return await fut

    def _start_flush(self) -> None:
        batch, self._pending = self._pending, []
        self._flush_scheduled = False
        task = asyncio.get_running_loop().create_task(self._flush(batch))
        self._tasks.add(task)  # keep a reference until done, or the loop may drop it
        task.add_done_callback(self._tasks.discard)

    async def _flush(self, batch: list[tuple[list[str], list[str], asyncio.Future]]) -> None:
        try:
            if len(batch) == 1:
                keys, args, fut = batch[0]
                results: list = [await self._eval(keys, args)]
            else:
                results = await self._eval_pipelined([(k, a) for k, a, _ in batch])
        except asyncio.CancelledError:
            for _, _, fut in batch:
                fut.cancel()
            raise
        except Exception as e:  # noqa: BLE001 - every waiter gets the failure, none hangs
            results = [e] * len(batch)
        for (_, _, fut), res in zip(batch, results):
            if fut.done():
                continue
            if isinstance(res, BaseException):
                fut.set_exception(res)
            else:
                fut.set_result(res)

    async def _eval_pipelined(self, calls: list[tuple[list[str], list[str]]]) -> list:
        if self._sha is None:
            self._sha = await self._r.script_load(LUA)
        for attempt in (0, 1):
            pipe = self._r.pipeline(transaction=False)
            for keys, args in calls:
                pipe.evalsha(self._sha, len(keys), *keys, *args)
            results = await pipe.execute(raise_on_error=False)
            # A flushed script cache fails every call of the batch alike: nothing ran, so rerun all.
            if attempt == 0 and any(isinstance(r, NoScriptError) for r in results):
                self._sha = await self._r.script_load(LUA)
                continue
            return results
        return results

    def _args(self, mode: str, items: Sequence[tuple[Charge, int]]) -> tuple[list[str], list[str]]:
        keys = [f"{self._prefix}:{c.key}" for c, _ in items]
        args = [mode, "" if self.now_override_us is None else str(self.now_override_us)]
        for c, amt in items:
            args += (str(c.params.rate_milli), str(c.params.burst_nano), str(amt))
        return keys, args

    async def take(self, charges: Sequence[Charge]) -> TakeResult:
        if not charges:
            return TakeResult(True, ())
        keys, args = self._args("take", [(c, c.cost_nano) for c in charges])
        reply = await self._submit(keys, args)
        allowed = int(reply[0]) == 1
        views = []
        for c, raw in zip(charges, reply[1:]):
            level = int(raw)
            w = 0 if allowed else bucket.wait_us(level, c.cost_nano, c.params)
            views.append(BucketView(c, level, w))
        return TakeResult(allowed, tuple(views))

    async def adjust(self, items: Sequence[tuple[Charge, int]]) -> None:
        if items:
            keys, args = self._args("adjust", items)
            await self._submit(keys, args)

    async def read(self, keys: Sequence[str]) -> tuple[int, list[tuple[int, int] | None]]:
        """Redis TIME (us) and each bucket's stored (level nano, time us); None: no such bucket
        (a full one). Read-only: nothing is refilled or written."""
        pipe = self._r.pipeline(transaction=False)
        pipe.time()
        for k in keys:
            pipe.hmget(f"{self._prefix}:{k}", "l", "t")
        res = await pipe.execute()
        sec, usec = res[0]
        out: list[tuple[int, int] | None] = []
        for lv, ts in res[1:]:
            out.append(None if lv is None else (int(lv), int(ts)))
        return int(sec) * 1_000_000 + int(usec), out

    async def ping(self) -> bool:
        return bool(await self._r.ping())

    async def close(self) -> None:
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
        await self._r.aclose()
