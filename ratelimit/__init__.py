"""Token bucket rate limiting: pure bucket math, memory and Redis stores, Envoy RLS, a tuner (tuning/), a live status."""

from .config import RateLimitConfig, parse_config
from .decision import Decision, Reservation
from .limiter import Limiter
from .rules import RequestContext

__all__ = ["Decision", "Limiter", "RateLimitConfig", "RequestContext", "Reservation", "parse_config"]
