"""May this call read the cache, write it, and how old may an answer be: pure decisions over the
model's policy, the request and the caller's `Cache-Control`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from adapters.internal import ChatRequest
from adapters.json_types import JSONObject
from contracts.config.response_cache import CachePolicy
from contracts.envoy_names import CACHE_HEADER

__all__ = ["CACHE_HEADER", "CallerControl", "Verdict", "fresh", "parse_cache_control", "refusal", "scope_id"]

Verdict = Literal["hit", "miss", "bypass", "semantic"]
# Body fields whose answers the stored form cannot carry (several choices, token log-probabilities).
_UNCACHEABLE_FIELDS = ("n", "logprobs", "top_logprobs", "candidateCount")


@dataclass(frozen=True, slots=True)
class CallerControl:
    """The caller's `Cache-Control`: read (a stored answer may serve it), write (its answer may be
    kept), and the oldest answer it accepts."""

    read: bool = True
    write: bool = True
    max_age_s: float | None = None


DEFAULT_CONTROL = CallerControl()


def parse_cache_control(value: str | None) -> CallerControl:
    """`no-store`: neither read nor write; `no-cache`: go upstream and keep the fresh answer;
    `max-age=N`: an entry at most N seconds old. Unknown directives are ignored (RFC 9111)."""
    if not value:
        return DEFAULT_CONTROL
    read = write = True
    max_age: float | None = None
    for part in value.lower().split(","):
        name, _, arg = part.strip().partition("=")
        if name == "no-store":
            read = write = False
        elif name == "no-cache":
            read = False
        elif name == "max-age":
            try:
                max_age = max(0.0, float(int(arg.strip().strip('"'))))
            except ValueError:
                continue  # a malformed max-age is ignored, as a cache ignores any directive it cannot read
    return CallerControl(read, write, max_age)


def refusal(policy: CachePolicy, req: ChatRequest, extra: JSONObject) -> str | None:
    """Why this request is never cached under `policy` (None: it may be)."""
    if req.native_only:
        return "native-only request"
    if req.temperature is not None and req.temperature > 0 and not policy.temperature_above_zero:
        return "temperature above zero"
    for name in _UNCACHEABLE_FIELDS:
        v = extra.get(name)
        if v not in (None, False, 1):
            return f"{name} set"
    return None


def fresh(stored_at: float, expires_at: float, now: float, max_age_s: float | None) -> bool:
    """An entry serves now: not past its TTL, nor older than the caller accepts."""
    return now < expires_at and (max_age_s is None or now - stored_at <= max_age_s)


def scope_id(policy: CachePolicy, tenant: str, key_id: str | None) -> str | None:
    """Whose entries a call reads and writes; None: it cannot be scoped (a `key` scope for a key
    from the config file, which has no id: such calls bypass rather than share the tenant's)."""
    if policy.scope == "shared":
        return "shared"
    if policy.scope == "key":
        return f"key:{key_id}" if key_id else None
    return f"tenant:{tenant}"
