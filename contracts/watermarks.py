"""The GPU agent's watermark wire format: `GET /watermarks` of `modelyard agent` (gpuagent/agent.py
writes it, the extproc's pollers read it), and the reading both sides compute from it.

A watermark is the busiest GPU's pressure, max over GPUs of max(util, memory used fraction),
in [0, 1]. Readings carry the monotonic time they arrived so the scheduler can treat an old
reading as saturated.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import orjson

from contracts.errors import UpstreamError


class WatermarkParseError(UpstreamError):
    """A watermark source answered with something that is not a usable reading."""


@dataclass(frozen=True, slots=True)
class GpuReading:
    index: int
    util: float  # percent, 0..100, as NVML and DCGM report it
    mem_used: float
    mem_total: float

    @property
    def pressure(self) -> float:
        mem = self.mem_used / self.mem_total if self.mem_total > 0 else 0.0
        return max(self.util / 100.0, mem)


@dataclass(frozen=True, slots=True)
class Reading:
    """One watermark observation; `ts` is the monotonic clock when it arrived."""

    watermark: float
    ts: float
    gpus: tuple[GpuReading, ...] = ()
    source: str = "agent"
    # The source itself says it is saturated (not used for staleness: the scheduler checks `ts`).
    saturated: bool = False

    def age(self, now: float) -> float:
        return now - self.ts


def watermark_of(gpus: tuple[GpuReading, ...] | list[GpuReading]) -> float:
    return min(1.0, max((g.pressure for g in gpus), default=0.0))


def _number(v: object, where: str, lo: float, hi: float) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise WatermarkParseError(f"{where}: expected a number, got {type(v).__name__}")
    f = float(v)
    if not math.isfinite(f) or f < lo or f > hi:
        raise WatermarkParseError(f"{where}: {v!r} is outside [{lo}, {hi}]")
    return f


def parse_agent_json(body: bytes | str, now: float = 0.0) -> Reading:
    """Parse `GET /watermarks` of `modelyard agent`. The watermark is recomputed from `gpus`
    when present (the agent's own `watermark` is used only when it lists no GPUs)."""
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError as e:
        raise WatermarkParseError(f"agent watermarks: not JSON ({e})") from None
    if not isinstance(doc, dict):
        raise WatermarkParseError("agent watermarks: expected a JSON object")
    raw = doc.get("gpus", [])
    if not isinstance(raw, list):
        raise WatermarkParseError("agent watermarks: gpus must be a list")
    gpus = []
    for i, g in enumerate(raw):
        if not isinstance(g, dict):
            raise WatermarkParseError(f"agent watermarks: gpus[{i}] must be an object")
        idx = g.get("index", i)
        if isinstance(idx, bool) or not isinstance(idx, int):
            raise WatermarkParseError(f"agent watermarks: gpus[{i}].index must be an integer")
        total = _number(g.get("mem_total"), f"gpus[{i}].mem_total", 0, 1e18)
        gpus.append(
            GpuReading(
                index=idx,
                util=_number(g.get("util"), f"gpus[{i}].util", 0, 100),
                mem_used=_number(g.get("mem_used"), f"gpus[{i}].mem_used", 0, max(total, 0)),
                mem_total=total,
            )
        )
    if gpus:
        wm = watermark_of(gpus)
    elif "watermark" in doc:
        wm = _number(doc["watermark"], "agent watermarks: watermark", 0, 1)
    else:
        raise WatermarkParseError("agent watermarks: neither gpus nor watermark present")
    source = doc.get("source", "agent")
    return Reading(wm, now, tuple(gpus), source if isinstance(source, str) else "agent")
