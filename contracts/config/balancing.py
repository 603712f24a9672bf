"""A deployment's readiness and spread: `lb:` and `health_check:` (rendered into its Envoy cluster
by `controlplane/balancing.py`) and `warmup:` (sent by the extproc, `extproc/telemetry/warmup.py`)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

LbPolicyName = Literal["round_robin", "least_request", "ring_hash", "random"]


class LoadBalancing(BaseModel):
    """`round_robin` is weighted when `weights` are given; `ring_hash` keeps a caller on one
    endpoint by the value of `hash_header` (session affinity)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    policy: LbPolicyName = "round_robin"
    # endpoint ("host:port", as listed in `endpoints`) -> relative weight; unlisted endpoints weigh 1.
    weights: dict[str, int] = Field(default_factory=dict)
    hash_header: str | None = Field(None, pattern=r"^[a-z0-9-]+$")

    @model_validator(mode="after")
    def _consistent(self) -> LoadBalancing:
        if (self.policy == "ring_hash") != (self.hash_header is not None):
            raise ValueError("ring_hash needs hash_header, and hash_header is only for ring_hash")
        for ep, w in self.weights.items():
            if not 1 <= w <= 128:
                raise ValueError(f"weight of {ep!r} must be 1..128, not {w}")
        if self.weights and self.policy == "random":
            raise ValueError("random ignores weights: use round_robin or least_request")
        return self


class HealthCheckConfig(BaseModel):
    """Envoy's active health check of every endpoint: an HTTP GET of `http_path` (any 2xx is
    healthy) or the gRPC health protocol (`grpc_service`, "" for the whole server)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    http_path: str | None = Field(None, pattern=r"^/")
    grpc_service: str | None = None
    interval_s: float = Field(5.0, gt=0, le=300)
    timeout_s: float = Field(1.0, gt=0, le=60)
    unhealthy_threshold: int = Field(2, ge=1, le=100)
    healthy_threshold: int = Field(1, ge=1, le=100)

    @model_validator(mode="after")
    def _one_kind(self) -> HealthCheckConfig:
        if (self.http_path is None) == (self.grpc_service is None):
            raise ValueError("set exactly one of http_path (HTTP GET) or grpc_service (gRPC health; '' = server)")
        return self


class WarmupConfig(BaseModel):
    """A request the gateway sends a deployment before routing real traffic to it: at start, on a
    config reload (SIGHUP) and when it comes back from a cooldown. Chat deployments get a one-token
    completion of `prompt` in their own protocol; KServe ones a model-readiness call."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    prompt: str = Field("ping", min_length=1, max_length=4096)
    max_tokens: int = Field(1, ge=1, le=256)
    # Give up after this long (the deployment is routed to anyway; its failures count as usual).
    timeout_s: float = Field(60.0, gt=0, le=3600)
    retry_interval_s: float = Field(1.0, gt=0, le=60)


class ReplicaWeights(BaseModel):
    """The replica picker's score terms (docs/routing.md); only ratios matter."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    queue: float = Field(1.0, ge=0)
    kv_cache: float = Field(0.5, ge=0)
    lora: float = Field(0.5, ge=0)
    prefix: float = Field(0.5, ge=0)


class ReplicaMetrics(BaseModel):
    """Poll every endpoint's own model-server metrics and pick the replica per request; Envoy
    then sends the call to exactly that endpoint (override-host), or balances as usual when the
    readings are stale."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: Literal["vllm", "sglang", "tgi", "triton"]
    path: str = Field("/metrics", pattern=r"^/")
    # Triton serves its metrics on another port (8002) than inference: the port to poll, if not the endpoint's.
    port: int | None = Field(None, ge=1, le=65535)
    interval_ms: int = Field(50, ge=10, le=60_000)
    # Older than this, a reading is not used; default 4 intervals.
    stale_after_ms: int | None = Field(None, ge=10, le=600_000)
    weights: ReplicaWeights = ReplicaWeights()
    # The queue length at which the queue term halves: 1 / (1 + queue / queue_scale).
    queue_scale: float = Field(8.0, gt=0)
    # A replica this many calls behind the shortest fresh queue loses its prefix affinity for the call:
    # a popular system prompt otherwise pins every conversation on it to one replica at saturation
    # (bench/bench_replicas.py --trace). None: affinity always counts.
    balance_gap: float | None = Field(None, gt=0)
    # Prefix affinity: the first `prefix_blocks` blocks of `block_chars` prompt characters, hashed.
    # Deep enough (32 KB) to tell a conversation's history from its system prompt: at saturation the
    # shallower 8 x 256 held every call on a system prompt to one replica (bench/bench_replicas.py).
    block_chars: int = Field(512, ge=16, le=65_536)
    prefix_blocks: int = Field(64, ge=0, le=64)
    prefix_entries: int = Field(10_000, ge=0, le=1_000_000)  # the LRU's bound
    # Bounded-load prefix placement (extproc/replicas/bounded.py): a replica keeps a call's prefix
    # affinity only within (1 + load_bound) x the mean queue, else it spills along the prefix's ring;
    # None and prefix_ways 1: the earlier placement (wherever the prefix was last sent), which
    # bench_replicas measured worse at saturation (docs/routing.md). `prefix_ways`: replicas per block.
    load_bound: float | None = Field(0.25, ge=0, le=10)
    prefix_ways: int = Field(4, ge=1, le=16)
    # A replica whose call failed is not picked again for this long (unless nothing else is fresh).
    failure_hold_ms: int = Field(2_000, ge=0, le=600_000)

    @property
    def stale_after_s(self) -> float:
        return (self.stale_after_ms if self.stale_after_ms is not None else 4 * self.interval_ms) / 1000.0
