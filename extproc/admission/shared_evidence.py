"""The learning strategy's evidence shared by every worker and replica (`routing.adaptive.store: redis`).

Each process learns into its own `Bandit` on the request path (no I/O there) and, every `sync_s`
in the background, hands Redis what it learned since the last round and reads back the sum of
everyone's: one Lua script per group (a hash per model, channel and tenant; one field per arm,
`wins,losses,at`), which decays the stored evidence to Redis's own clock (`TIME`: one clock for
every host), adds the deltas and returns the totals. A Redis that does not answer leaves each
process learning alone (its pending evidence is kept for the next round), logged once: a shared
store going dark must not stop routing.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from extproc.routing.bandit import ArmEvidence, Bandit, GroupKey

log = logging.getLogger("modelyard.bandit")

# KEYS[1]: the group's hash. ARGV: half-life s, ttl s, then (arm, wins, losses) triples. Returns
# (arm, wins, losses) triples of the totals now.
_ADD = r"""
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local hl = tonumber(ARGV[1])
local out = {}
for i = 3, #ARGV, 3 do
  local arm = ARGV[i]
  local w, l, at = 0, 0, now
  local cur = redis.call('HGET', KEYS[1], arm)
  if cur then
    local a, b, c = string.match(cur, '([^,]+),([^,]+),([^,]+)')
    w, l, at = tonumber(a), tonumber(b), tonumber(c)
  end
  if now > at then
    local f = math.pow(0.5, (now - at) / hl)
    w, l = w * f, l * f
  end
  w, l = w + tonumber(ARGV[i + 1]), l + tonumber(ARGV[i + 2])
  redis.call('HSET', KEYS[1], arm, string.format('%.17g,%.17g,%.17g', w, l, now))
  out[#out + 1] = arm
  out[#out + 1] = string.format('%.17g', w)
  out[#out + 1] = string.format('%.17g', l)
end
redis.call('EXPIRE', KEYS[1], tonumber(ARGV[2]))
return out
"""


def group_key(prefix: str, key: GroupKey) -> str:
    model, channel, tenant = key
    return f"{prefix}bandit:{model}|{channel}|{tenant}"


class SharedEvidence:
    """The background sync of one process's bandit with Redis (`bandit` read afresh each round: reloads)."""

    def __init__(self, url: str, bandit: Callable[[], Bandit], *, prefix: str = "{my}", timeout_ms: int = 200) -> None:
        import redis.asyncio as aioredis  # only with store: redis

        t = timeout_ms / 1000
        self._r = aioredis.from_url(url, socket_timeout=t, socket_connect_timeout=t)
        self._add = self._r.register_script(_ADD)
        self._bandit = bandit
        self._prefix = prefix
        self._task: asyncio.Task[None] | None = None
        self._failing = False

    async def sync_once(self) -> None:
        """Push what was learned here, read everyone's totals back into the local bandit."""
        b = self._bandit()
        s = b.settings
        now = time.monotonic()
        deltas = b.take_pending(now)
        groups = b.groups()
        for key, arm in deltas:
            groups.setdefault(key, set()).add(arm)
        ttl = max(60, round(s.half_life_s * 20))  # long after the evidence has faded to nothing
        try:
            for key, arms in groups.items():
                args: list[str | float] = [s.half_life_s, ttl]
                for arm in sorted(arms):
                    w, lo = deltas.get((key, arm), (0.0, 0.0))
                    args += [arm, repr(w), repr(lo)]
                out = await self._add(keys=[group_key(self._prefix, key)], args=args)
                for arm in arms:  # stored: not handed back if a later group fails
                    deltas.pop((key, arm), None)
                at = time.monotonic()
                for i in range(0, len(out), 3):
                    arm = out[i].decode() if isinstance(out[i], bytes) else str(out[i])
                    b.merge(key, arm, float(out[i + 1]), float(out[i + 2]), at)
        except Exception as e:  # redis errors, timeouts: learn alone until it answers again
            if b.pending is not None:  # hand back what was not stored, for the next round
                for (key, arm), (w, lo) in deltas.items():
                    b.pending.setdefault((key, arm), ArmEvidence(at=now)).add(w, lo, now, s.half_life_s)
            if not self._failing:
                log.warning("learning strategy: Redis does not answer (%s); each process learns alone until it does", e)
                self._failing = True
            return
        if self._failing:
            log.warning("learning strategy: Redis answers again; evidence is shared")
            self._failing = False

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self._bandit().settings.sync_s)
            await self.sync_once()

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        await self._r.aclose()

