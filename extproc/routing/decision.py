"""What a routing decision takes and gives: the request, the ranked candidates, the rejections."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from contracts.config import Deployment, ModelConfig, TenantConfig
from contracts.config.routing import Weights
from contracts.config.service_levels import Channel
from extproc.routing.share_breaker import ShareTrip

Arm = Literal["A", "B"]
# Which check dropped a deployment; `Rejection.reason` is the human-readable account of it.
Check = Literal[
    "task_type", "tools", "vision", "streaming", "channel", "context_window", "max_output_tokens",
    "cooldown", "warming", "no_reading", "stale_reading", "saturated", "fast_quota", "fast_tier", "reserved",
    "breaker", "share",
]
# Checks that may pass later (a retry can help, so no route is a 503); the rest never change.
RUNTIME_CHECKS: frozenset[Check] = frozenset(
    {"cooldown", "warming", "no_reading", "stale_reading", "saturated", "fast_quota", "fast_tier", "breaker", "share"}
)


# When a check would leave no deployment at all, it is set aside rather than become an outage:
# "cooldown" when every deployment is cooling down (Envoy's panic routing, in effect), and
# "watermarks" when no deployment has a fresh reading (monitoring is dark: route as if unmonitored).
FailOpen = Literal["cooldown", "watermarks", "warming"]

@dataclass(frozen=True, slots=True)
class RouteRequest:
    model: str
    tenant: TenantConfig
    strategy_override: str | None = None
    want_fast: bool = False
    est_prompt_tokens: int = 0
    # The call's own output cap (max_tokens and its kin): models whose capabilities.max_output_tokens
    # is lower are filtered, and the cost estimate uses it; None: routing.est_output_tokens.
    est_output_tokens: int | None = None
    needs_tools: bool = False
    needs_vision: bool = False
    stream: bool = False
    # Free text from the request path: an unknown task type is a 400, not a type error.
    task_type: str = "chat"
    task_id: str = ""


@dataclass(frozen=True, slots=True)
class Candidate:
    model: str
    deployment: Deployment
    channel: Channel
    score: float
    terms: Mapping[str, float]
    model_config: ModelConfig
    # Admitted to the fast channel (counts as fast use); False for fast-only models serving
    # a request that was not admitted or did not ask.
    fast_admitted: bool = False

    @property
    def cluster(self) -> str:
        return self.deployment.cluster


@dataclass(frozen=True, slots=True)
class Rejection:
    model: str
    cluster: str
    reason: str
    check: Check

    @property
    def runtime(self) -> bool:
        """Runtime reasons (cooldown, watermark, admission) pass; static ones (capabilities) do not."""
        return self.check in RUNTIME_CHECKS


@dataclass(frozen=True, slots=True)
class Learned:
    """The bandit chose `arm` (a cluster) with probability `propensity` among `shares`."""

    arm: str
    propensity: float
    shares: Mapping[str, float]


@dataclass(frozen=True, slots=True)
class Decision:
    candidates: tuple[Candidate, ...]
    strategy: str
    arm: Arm
    weights: Weights
    fast_requested: bool
    rejected: tuple[Rejection, ...] = ()
    # Checks set aside because they would have rejected every deployment (see `FailOpen`).
    fail_open: tuple[FailOpen, ...] = ()
    # The learning strategy's pick (routing.adaptive): the chosen deployment, its propensity, the shares.
    learned: Learned | None = None
    # Share breakers this call tripped (routing.share_breakers): the caller meters and logs them.
    share_trips: tuple[ShareTrip, ...] = ()

    @property
    def chosen(self) -> Candidate:
        return self.candidates[0]

    @property
    def channel(self) -> Channel:
        """The channel of the first choice; after a failover use that candidate's `channel`."""
        return self.candidates[0].channel

    @property
    def downgraded(self) -> bool:
        """Asked for fast and not admitted: silently served on the standard channel (or on a
        fast-only model's deployment without counting as fast use)."""
        return self.fast_requested and not self.candidates[0].fast_admitted
