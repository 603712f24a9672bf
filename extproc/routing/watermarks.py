"""GPU watermarks as routing reads them: the DCGM exporter's text parser, and the one entry the
pollers (`extproc/telemetry/pollers.py`) call for either source. The agent's JSON, the readings
and the watermark itself are the wire contract in `contracts/watermarks.py`.
"""

from __future__ import annotations

import math

from contracts.watermarks import GpuReading, Reading, WatermarkParseError, parse_agent_json, watermark_of
from extproc.routing.exposition import sample

_DCGM = {"DCGM_FI_DEV_GPU_UTIL": "util", "DCGM_FI_DEV_FB_USED": "used", "DCGM_FI_DEV_FB_FREE": "free"}


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
        name, labels, value = sample(line, lineno, WatermarkParseError, "dcgm metrics")
        kind = _DCGM.get(name)
        if kind is None:
            continue
        key = labels.get("gpu") or labels.get("UUID") or "0"
        if not math.isfinite(value) or value < 0:
            raise WatermarkParseError(f"dcgm metrics line {lineno}: {value} out of range")
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
