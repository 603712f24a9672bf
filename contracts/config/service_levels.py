"""Service levels: a tenant's tier and a deployment's channel, the two axes of fast admission, and a
deployment's latency objective, which its measured latency is held to."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

Tier = Literal["L1", "L2", "L3"]
Channel = Literal["standard", "fast"]


class LatencyObjective(BaseModel):
    """A deployment's latency objective (`slo:`): while the P99 of the gateway's own recent calls to
    it (the TTFT P99 for streams) is over the objective, it counts as loaded at `load`, a watermark,
    for tiered fast-channel admission and the load term (docs/routing.md). Fewer than `min_samples`
    calls in the window: not judged (fail open)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    p99_ms: float | None = Field(None, gt=0)  # whole answers (calls that do not stream)
    ttft_ms: float | None = Field(None, gt=0)  # time to the first chunk (streams)
    window_s: float = Field(60.0, gt=0, le=3600)  # only calls that ended this recently count
    min_samples: int = Field(20, ge=1, le=100_000)
    load: float = Field(0.8, ge=0, le=1)  # the watermark it counts as while over: closed to L2 and L3 by default

    @model_validator(mode="after")
    def _some_objective(self) -> LatencyObjective:
        if self.p99_ms is None and self.ttft_ms is None:
            raise ValueError("set p99_ms, ttft_ms or both")
        return self
