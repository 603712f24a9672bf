"""Routing: which deployment serves a request (filter, score, admission, feedback).

Pure and synchronous; see docs/routing.md. The request path builds a `RouteRequest`, calls
`Scheduler.decide(req, now, board.readings)` and, after each upstream attempt,
`Scheduler.record(cluster, latency_s, ok, ttft_s, now=now)`.
"""

from contracts.config.routing import RoutingSettings, Weights, parse_routing_settings
from extproc.routing.decision import Candidate, Decision, Rejection, RouteRequest
from extproc.routing.errors import BadRouteRequest, ModelNotFound, NoCapacity, NoRoute
from extproc.routing.index import AUTO
from extproc.routing.scheduler import Scheduler

__all__ = [
    "AUTO",
    "BadRouteRequest",
    "Candidate",
    "Decision",
    "ModelNotFound",
    "NoCapacity",
    "NoRoute",
    "Rejection",
    "RouteRequest",
    "RoutingSettings",
    "Scheduler",
    "Weights",
    "parse_routing_settings",
]
