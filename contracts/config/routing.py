"""The `routing:` section of modelyard.yaml: strategies, A/B, cooldowns, admission, watermarks.

Every key has a default, so an empty section is valid. `contracts.config` parses it as part of the
whole file; `parse_routing_settings` parses the section alone (tests, tools) and turns any
validation failure into a ConfigError whose message names the key path (`routing.cooldown.failures`).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from contracts.config.service_levels import Tier
from contracts.errors import ConfigError

TERMS = ("quality", "latency", "cost", "load")


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Weights(_Model):
    """Weights of the four score terms; only their ratios matter (the score divides by the sum).
    The tolerances set how far apart two candidates' latencies (or costs) must be to move the score."""

    quality: float = Field(0.0, ge=0)
    latency: float = Field(0.0, ge=0)
    cost: float = Field(0.0, ge=0)
    load: float = Field(0.0, ge=0)
    # Differences within noise do not decide: the latency term scales by at least this share of the
    # fastest candidate's expected latency (and by at least latency_tolerance_ms), so 3 ms on 100 ms
    # is a small term while 100 ms against 300 ms is still the full one (docs/routing.md).
    latency_tolerance: float = Field(1.0, ge=0)
    latency_tolerance_ms: float = Field(10.0, ge=0)
    # The same for cost, as a share of the cheapest candidate's estimated cost.
    cost_tolerance: float = Field(0.5, ge=0)

    @model_validator(mode="after")
    def _positive(self) -> Weights:
        if self.total() <= 0:
            raise ValueError("at least one weight must be positive")
        return self

    def total(self) -> float:
        return self.quality + self.latency + self.cost + self.load

    def normalised(self) -> tuple[float, float, float, float]:
        t = self.total()
        return (self.quality / t, self.latency / t, self.cost / t, self.load / t)

    def terms(self) -> dict[str, float]:
        """The four weights alone, by term name."""
        return {t: getattr(self, t) for t in TERMS}

    def tolerances(self) -> dict[str, float]:
        """How far apart latencies and costs must be to count in full (`route explain` shows them)."""
        return {"latency": self.latency_tolerance, "latency_ms": self.latency_tolerance_ms,
                "cost": self.cost_tolerance}


DEFAULT_STRATEGIES: dict[str, Weights] = {
    "cost": Weights(quality=0.1, latency=0.15, cost=0.6, load=0.15),
    "speed": Weights(quality=0.15, latency=0.6, cost=0.05, load=0.2),
    "quality": Weights(quality=0.8, latency=0.1, cost=0.05, load=0.05),
    "balanced": Weights(quality=0.35, latency=0.25, cost=0.25, load=0.15),
}


class ABSettings(_Model):
    """A share of traffic (by task-id hash) scores with weight set B of its strategy."""

    share_b: float = Field(0.0, ge=0, le=1)
    weights_b: dict[str, Weights] = Field(default_factory=dict)


class CooldownSettings(_Model):
    """`failures` failures within `window_s` seconds take a cluster out for `cooldown_s` seconds."""

    failures: int = Field(3, ge=1)
    window_s: float = Field(60.0, gt=0)
    cooldown_s: float = Field(30.0, ge=0)


class FeedbackSettings(_Model):
    # EWMA smoothing factor: weight of the newest sample.
    alpha: float = Field(0.2, gt=0, le=1)
    # The configured latency_ms counts as this many samples when blended with observations.
    prior_weight: float = Field(5.0, ge=0)
    # Error rates decay toward zero, and observed latencies lose weight against the prior, with this
    # half-life: a deployment nobody routes to any more still heals (None: they never decay).
    half_life_s: float | None = Field(30.0, gt=0)
    # The error rate moves a deployment only on evidence: this many failures in a row (no success
    # between; Envoy's outlier detection waits for 5 consecutive 5xx) ...
    consecutive_failures: int = Field(5, ge=1)
    # ... or this many recent outcomes (decayed with half_life_s), and then by their failure share.
    min_samples: int = Field(20, ge=1)


class TierAdmission(_Model):
    """Fast-channel admission for one tier: below `max_watermark` (None: always), at most
    `trial_per_minute` fast requests per tenant per minute (None: unlimited)."""

    max_watermark: float | None = Field(None, ge=0, le=1)
    trial_per_minute: int | None = Field(None, ge=0)


def _default_admission() -> dict[Tier, TierAdmission]:
    return {
        "L1": TierAdmission(),
        "L2": TierAdmission(max_watermark=0.7),
        "L3": TierAdmission(max_watermark=0.4, trial_per_minute=10),
    }


class WatermarkSettings(_Model):
    interval_s: float = Field(1.0, gt=0, le=3600)
    # A reading older than this many intervals counts as saturated.
    stale_after_intervals: float = Field(3.0, gt=0)
    # Watermark assumed for deployments without a watermark source (hosted APIs).
    unmonitored: float = Field(0.0, ge=0, le=1)

    @property
    def stale_after_s(self) -> float:
        return self.interval_s * self.stale_after_intervals


class RewardWeights(_Model):
    """What one call is worth to the learning strategy, each term in [0, 1]: the answer came
    (success), how fast against `latency_target_ms`, how cheap against `cost_target`, and the
    caller's own score (`POST /v1/feedback`, learned when it arrives). Only ratios matter."""

    success: float = Field(1.0, ge=0)
    latency: float = Field(0.5, ge=0)
    cost: float = Field(0.0, ge=0)
    feedback: float = Field(0.0, ge=0)


class AdaptiveSettings(_Model):
    """`routing.adaptive`: a bandit picks among a model's deployments on one channel (docs/routing.md)."""

    # Models whose deployments the bandit picks among (the filters run first; it reorders survivors).
    models: list[str] = Field(default_factory=list)
    reward: RewardWeights = RewardWeights()
    # The latency term is target / (target + latency): 0.5 at the target, toward 1 when much faster.
    latency_target_ms: float = Field(1000.0, gt=0)
    # The cost term is target / (target + cost), per call, in the price table's currency.
    cost_target: float = Field(0.01, gt=0)
    # Every arm keeps at least this share of the calls (exploration that never stops).
    floor: float = Field(0.05, ge=0, le=0.5)
    # Evidence halves every half_life_s: an arm that failed is tried again as its lesson fades.
    half_life_s: float = Field(60.0, gt=0)
    # Draws of the posterior that estimate each arm's chance to be best (Thompson, probability matching).
    draws: int = Field(256, ge=16, le=10_000)
    # The shares are recomputed at most this often (seconds; the hot path reads the cached ones).
    refresh_s: float = Field(0.1, ge=0)
    # Per-tenant learning, or one shared lesson for all tenants.
    per_tenant: bool = False
    # Where the evidence lives: this process (memory) or Redis (ratelimit.redis.url), shared by replicas.
    store: Literal["memory", "redis"] = "memory"
    sync_s: float = Field(0.5, gt=0)


class GroupBreakerSettings(_Model):
    """A total breaker over a group (a model, or a channel): its deployments' combined error rate
    over `window_s` past `error_rate` opens it for `open_s`; then `probes` calls test it (half-open).
    Open, its deployments are routed around (another model of the asked group or the other channel
    serves: a spill), and with none left the call is refused at once (503, retry-after)."""

    model: str | None = None
    channel: Literal["standard", "fast"] | None = None
    window_s: float = Field(30.0, gt=0)
    min_calls: int = Field(10, ge=1)
    error_rate: float = Field(0.5, gt=0, le=1)
    open_s: float = Field(10.0, gt=0)
    probes: int = Field(2, ge=1)

    @model_validator(mode="after")
    def _one_group(self) -> GroupBreakerSettings:
        if (self.model is None) == (self.channel is None):
            raise ValueError("a breaker names exactly one of `model` or `channel`")
        return self

    @property
    def group(self) -> str:
        return f"model:{self.model}" if self.model is not None else f"channel:{self.channel}"


class ShareBreakerSettings(_Model):
    """A total breaker over a group of models (a model group such as `auto`, or listed `models`) that
    trips on concentration: when one member took more than `max_share` of the group's routed calls
    over `window_s` (with at least `min_calls`), that member is skipped for `open_s` and until its
    share falls back to `max_share` or under; it still serves when no other member can take a call."""

    group: str | None = None
    models: list[str] | None = None
    window_s: float = Field(30.0, gt=0)
    min_calls: int = Field(10, ge=1)
    max_share: float = Field(0.6, gt=0, lt=1)
    open_s: float = Field(10.0, gt=0)

    @model_validator(mode="after")
    def _one_group(self) -> ShareBreakerSettings:
        if (self.group is None) == (self.models is None):
            raise ValueError("a share breaker names exactly one of `group` or `models`")
        if self.models is not None and len(set(self.models)) < 2:
            raise ValueError("a share breaker's `models` lists at least two models")
        return self

    @property
    def name(self) -> str:
        return self.group if self.group is not None else "+".join(self.models or ())


class RoutingSettings(_Model):
    strategies: dict[str, Weights] = Field(default_factory=lambda: dict(DEFAULT_STRATEGIES))
    ab: ABSettings = ABSettings()
    saturation_threshold: float = Field(0.9, gt=0, le=1)
    cooldown: CooldownSettings = CooldownSettings()
    feedback: FeedbackSettings = FeedbackSettings()
    admission: dict[Tier, TierAdmission] = Field(
        default_factory=_default_admission
    )
    watermarks: WatermarkSettings = WatermarkSettings()
    # Output tokens assumed for the cost estimate when the request does not cap them.
    est_output_tokens: int = Field(256, ge=0)
    # Failover list length a decision returns (0: every usable deployment).
    max_candidates: int = Field(8, ge=0)
    # Strategies under which an idle spot / preemptible deployment (`spot: true`, a free slot) goes
    # first among its channel's deployments, whatever its score; busy spot capacity is scored as usual.
    spot_first: list[str] = Field(default_factory=lambda: ["cost"])
    # The learning strategy (issue 41): a bandit over the deployments of the models it names.
    adaptive: AdaptiveSettings = AdaptiveSettings()
    # Total breakers over groups (a model's or a channel's deployments together).
    breakers: list[GroupBreakerSettings] = Field(default_factory=list)
    # Concentration breakers over groups of models: no member takes more than max_share of the calls.
    share_breakers: list[ShareBreakerSettings] = Field(default_factory=list)
    # A call asking more output tokens than a model's capabilities.max_output_tokens: `filter` leaves
    # such models out (none left: 400); `clamp` does too while another can give it, and else routes
    # anyway, lowering the cap to the model's limit on translated calls (x-modelyard-output-clamped).
    output_limit: Literal["filter", "clamp"] = "filter"

    @field_validator("strategies")
    @classmethod
    def _merge_strategies(cls, v: dict[str, Weights]) -> dict[str, Weights]:
        # Configured strategies replace or extend the four built-in ones.
        return {**DEFAULT_STRATEGIES, **v}

    @field_validator("admission", mode="before")
    @classmethod
    def _merge_admission(cls, v: Any) -> Any:
        # A tier entry overrides only the keys it names; the other keys keep their defaults.
        if not isinstance(v, dict):
            return v
        merged: dict[Any, Any] = {k: t.model_dump() for k, t in _default_admission().items()}
        for tier, given in v.items():
            merged[tier] = {**merged.get(tier, {}), **given} if isinstance(given, dict) else given
        return merged

    @model_validator(mode="after")
    def _ab_strategies_exist(self) -> RoutingSettings:
        for name in self.ab.weights_b:
            if name not in self.strategies:
                raise ValueError(f"ab.weights_b.{name}: no such strategy")
        for name in self.spot_first:
            if name not in self.strategies:
                raise ValueError(f"spot_first: no strategy {name!r}")
        return self


def _key_path(err: ValidationError, prefix: str) -> str:
    lines = []
    for e in err.errors():
        path = prefix
        for part in e["loc"]:
            path += f"[{part}]" if isinstance(part, int) else f".{part}"
        lines.append(f"{path}: {e['msg']}")
    return "; ".join(lines)


def parse_routing_settings(data: Any, prefix: str = "routing") -> RoutingSettings:
    """Validate the `routing:` mapping (None or {} gives the defaults); ConfigError names the key."""
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"{prefix}: expected a mapping")
    try:
        return RoutingSettings.model_validate(data)
    except ValidationError as e:
        raise ConfigError(_key_path(e, prefix)) from None
