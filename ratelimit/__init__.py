"""Token bucket rate limiting: pure bucket math, memory and Redis stores, Envoy RLS, a tuner (tuning/), a live status.

The `ratelimit:` section of the config is a contract: `contracts.config.ratelimit` (`parse_config`).
"""

from .decision import Decision, Reservation
from .limiter import Limiter
from .rules import KeyLimits, RequestContext

__all__ = ["Decision", "KeyLimits", "Limiter", "RequestContext", "Reservation"]
