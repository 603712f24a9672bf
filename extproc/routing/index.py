"""The config indexed once: one `Entry` per (model, deployment) holding what the checks and the
score read, and the members of every group."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from contracts.config import Deployment, ModelConfig
from contracts.config.queueing import DedicatedPool
from contracts.config.service_levels import Channel

AUTO = "auto"


@dataclass(frozen=True, slots=True)
class Entry:
    """One (model, deployment) pair with everything the filter and score read, precomputed."""

    model: ModelConfig
    dep: Deployment
    name: str
    cluster: str
    channel: Channel
    fast: bool
    # The model has no standard deployment, so its fast ones also carry standard traffic.
    fast_only_model: bool
    quality: float
    prior_latency_s: float
    cost_in: float
    cost_out: float
    context_window: int
    max_output_tokens: int
    tools: bool
    vision: bool
    streaming: bool
    task_types: frozenset[str]
    monitored: bool
    reserved_for: DedicatedPool | None = None
    spot: bool = False


def entries_of(m: ModelConfig) -> tuple[Entry, ...]:
    only_fast = all(d.channel == "fast" for d in m.deployments)
    return tuple(
        Entry(
            model=m,
            dep=d,
            name=m.name,
            cluster=d.cluster,
            channel=d.channel,
            fast=d.channel == "fast",
            fast_only_model=only_fast,
            quality=m.quality,
            prior_latency_s=m.latency_ms / 1000.0,
            # A deployment's own price (spot capacity, a cheaper region) overrides the model's.
            cost_in=(d.cost or m.cost).input_per_1k,
            cost_out=(d.cost or m.cost).output_per_1k,
            context_window=m.capabilities.context_window,
            max_output_tokens=m.capabilities.max_output_tokens,
            tools=m.capabilities.tools,
            vision=m.capabilities.vision,
            streaming=m.capabilities.streaming,
            task_types=frozenset(m.task_types),
            monitored=d.watermark is not None,
            reserved_for=d.reserved_for,
            spot=d.spot,
        )
        for d in m.deployments
    )


def groups_of(models: Sequence[ModelConfig]) -> dict[str, tuple[str, ...]]:
    """Group name -> member model names, in config order."""
    groups: dict[str, tuple[str, ...]] = {}
    for m in models:
        for g in m.groups:
            groups[g] = groups.get(g, ()) + (m.name,)
    # `auto` without a declared group of that name means every model.
    groups.setdefault(AUTO, tuple(m.name for m in models))
    return groups
