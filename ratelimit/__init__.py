"""Token bucket rate limiting: pure bucket math, memory and Redis stores, Envoy RLS, a tuner (tuning/), a live status.

The `ratelimit:` section of the config is a contract: `contracts.config.ratelimit` (`parse_config`).
"""

from contracts.compiled import select as _select_build

_select_build()  # the compiled or the pure build, decided before any module of this package loads

from .decision import Decision, Reservation
from .limiter import Limiter
from .rules import KeyLimits, RequestContext

__all__ = ["Decision", "KeyLimits", "Limiter", "RequestContext", "Reservation"]
