"""Metering rows for the store tests (and the child process they SIGKILL): a request record and
a rate-limit decision with test defaults."""

from __future__ import annotations

from extproc.telemetry.metering import DecisionRecord, MeterRecord


def record(task: str, tokens: int = 10, **kw: object) -> MeterRecord:
    base = dict(ts=1.0, task_id=task, tenant="t", tier="L1", model="m", cluster="c", channel="standard",
                status=200, latency_ms=1.0, ttft_ms=None, input_tokens=tokens, output_tokens=tokens, cost=0.0,
                strategy="", arm="")
    base.update(kw)
    return MeterRecord(**base)  # type: ignore[arg-type]


def decision(task: str, allowed: bool) -> DecisionRecord:
    return DecisionRecord(ts=1.5, task_id=task, tenant="t", tier="L1", cluster="c", channel="standard", model="m",
                          allowed=allowed, requests=1, tokens=42, limited_by="" if allowed else "t:tpm",
                          rule="" if allowed else "tpm", store="memory")
