"""GPU watermarks as routing reads them: readings, and pure parsers for agent JSON and DCGM text.

A watermark is the busiest GPU's pressure, max over GPUs of max(util, memory used fraction),
in [0, 1]. Readings carry the monotonic time they arrived so the scheduler can treat an old
reading as saturated. The pollers that fetch them live in `extproc/telemetry/pollers.py`.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

import orjson

from modelyard.errors import UpstreamError


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


_SAMPLE = re.compile(r"^([A-Za-z_:][A-Za-z0-9_:]*)(?:\{(.*)\})?\s+(\S+)(?:\s+\S+)?\s*$")
_LABEL = re.compile(r'\s*([A-Za-z_][A-Za-z0-9_]*)\s*=\s*"((?:[^"\\]|\\.)*)"\s*,?')
_DCGM = {"DCGM_FI_DEV_GPU_UTIL": "util", "DCGM_FI_DEV_FB_USED": "used", "DCGM_FI_DEV_FB_FREE": "free"}


def _labels(text: str, lineno: int) -> dict[str, str]:
    out: dict[str, str] = {}
    pos = 0
    while pos < len(text):
        m = _LABEL.match(text, pos)
        if m is None or m.end() == pos:
            if text[pos:].strip() in ("", ","):
                break
            raise WatermarkParseError(f"dcgm metrics line {lineno}: bad labels")
        out[m.group(1)] = m.group(2)
        pos = m.end()
    return out


def parse_dcgm_metrics(text: bytes | str, now: float = 0.0) -> Reading:
    """Parse a DCGM exporter's Prometheus text: GPU_UTIL (percent), FB_USED and FB_FREE (MiB),
    one series per GPU (label `gpu`, else `UUID`); other metrics are ignored."""
    if isinstance(text, bytes):
        text = text.decode("utf-8", "replace")
    per_gpu: dict[str, dict[str, float]] = {}
    order: list[str] = []
    for lineno, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#") or not line.startswith("DCGM_FI_DEV_"):
            continue
        m = _SAMPLE.match(line)
        if m is None:
            raise WatermarkParseError(f"dcgm metrics line {lineno}: not a sample")
        kind = _DCGM.get(m.group(1))
        if kind is None:
            continue
        labels = _labels(m.group(2) or "", lineno)
        key = labels.get("gpu") or labels.get("UUID") or "0"
        try:
            value = float(m.group(3))
        except ValueError:
            raise WatermarkParseError(f"dcgm metrics line {lineno}: bad value") from None
        if not math.isfinite(value) or value < 0:
            raise WatermarkParseError(f"dcgm metrics line {lineno}: {m.group(3)} out of range")
        if key not in per_gpu:
            per_gpu[key] = {}
            order.append(key)
        per_gpu[key][kind] = value
    if not per_gpu:
        raise WatermarkParseError("dcgm metrics: no DCGM_FI_DEV_GPU_UTIL / FB_USED / FB_FREE")
    gpus = []
    for i, key in enumerate(order):
        v = per_gpu[key]
        used, free = v.get("used", 0.0), v.get("free", 0.0)
        gpus.append(
            GpuReading(
                index=int(key) if key.isdigit() else i,
                util=min(100.0, v.get("util", 0.0)),
                mem_used=used,
                mem_total=used + free,
            )
        )
    return Reading(watermark_of(gpus), now, tuple(gpus), "dcgm")


def parse_reading(kind: str, body: bytes, now: float) -> Reading:
    if kind == "dcgm":
        return parse_dcgm_metrics(body, now)
    return parse_agent_json(body, now)
