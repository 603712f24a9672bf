"""When the request path may ask the store about a key its copy does not know (one created since the
last refresh): the miss path's decisions, pure (the caller passes the clock).

- a digest the store said is absent is not asked again for `absent_ttl_s` (a negative cache);
- asks are a token bucket (`per_s`, `burst`): a flood of invalid keys costs the store a bounded number;
- a failed or timed-out ask marks the store down for `down_s`: unknown keys are refused without one;
- at most `max_pending` asks run at once (a store that hangs holds no more threads than that).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field


class Verdict(enum.Enum):
    ASK = "ask"  # look the digest up in the store (a token was taken)
    ABSENT = "absent"  # the store said so within absent_ttl_s: refuse, no lookup
    LIMITED = "limited"  # over the lookup budget: refuse for now, no lookup
    DOWN = "down"  # the last lookup failed within down_s (or too many are pending): refuse, no lookup


@dataclass
class MissGate:
    per_s: float = 20.0
    burst: int = 50
    absent_ttl_s: float = 60.0
    down_s: float = 1.0
    max_pending: int = 4
    max_absent: int = 10_000  # a hard cap beside the bucket's (which already bounds inserts)
    _tokens: float = field(default=-1.0, init=False)
    _at: float = field(default=0.0, init=False)
    _absent: dict[str, float] = field(default_factory=dict, init=False)  # digest -> until (insertion order = expiry order)
    _down_until: float = field(default=0.0, init=False)
    pending: int = field(default=0, init=False)

    def check(self, digest: str, now: float) -> Verdict:
        """What to do with a digest the copy does not know; ASK takes a lookup token and a pending slot."""
        until = self._absent.get(digest)
        if until is not None:
            if now < until:
                return Verdict.ABSENT
            del self._absent[digest]
        if now < self._down_until or self.pending >= self.max_pending:
            return Verdict.DOWN
        self._refill(now)
        if self._tokens < 1.0:
            return Verdict.LIMITED
        self._tokens -= 1.0
        self.pending += 1
        return Verdict.ASK

    def absent(self, digest: str, now: float) -> None:
        """The store has no live key with this digest (none, or revoked)."""
        self._absent.pop(digest, None)
        self._absent[digest] = now + self.absent_ttl_s
        for old in list(self._absent):  # the oldest first: drop what expired, then what is over the cap
            if self._absent[old] > now and len(self._absent) <= self.max_absent:
                break
            del self._absent[old]

    def failed(self, now: float) -> None:
        """The store could not answer (an error or the timeout)."""
        self._down_until = now + self.down_s

    def settled(self) -> None:
        """An ASK's lookup ended (whatever it said): its pending slot is free."""
        self.pending = max(0, self.pending - 1)

    def _refill(self, now: float) -> None:
        if self._tokens < 0:  # the first check: a full bucket
            self._tokens, self._at = float(self.burst), now
            return
        self._tokens = min(float(self.burst), self._tokens + max(0.0, now - self._at) * self.per_s)
        self._at = now
