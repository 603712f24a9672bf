"""A/B readouts (`modelyard route ab`): the metering rows of each experiment's arms, side by side.

An experiment is a strategy with a B weight set (`routing.ab.weights_b`); its calls carry the arm
that scored them (`requests.strategy`, `requests.arm`), and a caller's scores (`POST /v1/feedback`)
join them by task id. Pure: `readout` takes rows and returns numbers with 95% intervals and a plain
verdict; `read_arm_calls` is the one reader, read-only over one or more metering stores.

Intervals: Wilson for the error rate, a normal interval of the mean for cost and feedback, and the
distribution-free order-statistic interval for the latency percentiles. A measure's verdict names
the better arm only when the two arms' intervals do not overlap (a conservative test: it may say
"no difference yet" where a test on the difference would not), and says "not enough data yet"
below `min_calls` calls per arm.
"""

from __future__ import annotations

import math
import sqlite3
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

Z95 = 1.959964
MIN_CALLS = 30


@dataclass(frozen=True, slots=True)
class ArmCall:
    """One metered call of an experiment's arm; `score` is its mean feedback, None without any."""

    strategy: str
    arm: str
    status: int
    latency_ms: float
    ttft_ms: float | None
    cost: float
    score: float | None = None


@dataclass(frozen=True, slots=True)
class Estimate:
    value: float | None
    low: float | None
    high: float | None
    n: int

    def as_dict(self) -> dict[str, object]:
        return {"value": self.value, "low": self.low, "high": self.high, "n": self.n}


@dataclass(frozen=True, slots=True)
class ArmReadout:
    arm: str
    requests: int
    error_rate: Estimate
    latency_p50_ms: Estimate
    latency_p99_ms: Estimate
    ttft_p50_ms: Estimate
    cost_per_request: Estimate
    feedback: Estimate


# Which way is better, per measure.
MEASURES: tuple[tuple[str, bool], ...] = (
    ("error_rate", False), ("latency_p50_ms", False), ("latency_p99_ms", False), ("ttft_p50_ms", False),
    ("cost_per_request", False), ("feedback", True),
)


@dataclass(frozen=True, slots=True)
class Experiment:
    strategy: str
    arms: tuple[ArmReadout, ...]
    verdicts: dict[str, str] = field(default_factory=dict)

    def as_dict(self) -> dict[str, object]:
        return {"strategy": self.strategy, "verdicts": self.verdicts,
                "arms": [{"arm": a.arm, "requests": a.requests,
                          **{m: getattr(a, m).as_dict() for m, _ in MEASURES}} for a in self.arms]}


def wilson(errors: int, n: int) -> Estimate:
    if n == 0:
        return Estimate(None, None, None, 0)
    p = errors / n
    denom = 1 + Z95 ** 2 / n
    centre = (p + Z95 ** 2 / (2 * n)) / denom
    half = Z95 * math.sqrt(p * (1 - p) / n + Z95 ** 2 / (4 * n * n)) / denom
    return Estimate(p, max(0.0, centre - half), min(1.0, centre + half), n)


def mean_interval(values: Sequence[float]) -> Estimate:
    n = len(values)
    if n == 0:
        return Estimate(None, None, None, 0)
    mean = math.fsum(values) / n
    if n == 1:
        return Estimate(mean, None, None, 1)
    var = math.fsum((v - mean) ** 2 for v in values) / (n - 1)
    half = Z95 * math.sqrt(var / n)
    return Estimate(mean, mean - half, mean + half, n)


def quantile_interval(values: Sequence[float], q: float) -> Estimate:
    """The nearest-rank q-quantile, and the order statistics whose ranks bound it at 95% (the
    binomial's normal approximation); an end past the data is None (not enough calls to bound it)."""
    xs = sorted(values)
    n = len(xs)
    if n == 0:
        return Estimate(None, None, None, 0)
    rank = max(1, math.ceil(q * n))
    half = Z95 * math.sqrt(n * q * (1 - q))
    lo, hi = math.floor(n * q - half), math.ceil(n * q + half) + 1
    return Estimate(xs[rank - 1], xs[lo - 1] if lo >= 1 else None, xs[hi - 1] if hi <= n else None, n)


def _arm(arm: str, calls: Sequence[ArmCall]) -> ArmReadout:
    ok = [c for c in calls if c.status < 500]
    ttfts = [c.ttft_ms for c in ok if c.ttft_ms is not None]
    scores = [c.score for c in calls if c.score is not None]
    return ArmReadout(
        arm=arm, requests=len(calls),
        error_rate=wilson(len(calls) - len(ok), len(calls)),
        latency_p50_ms=quantile_interval([c.latency_ms for c in ok], 0.5),
        latency_p99_ms=quantile_interval([c.latency_ms for c in ok], 0.99),
        ttft_p50_ms=quantile_interval(ttfts, 0.5),
        cost_per_request=mean_interval([c.cost for c in calls]),
        feedback=mean_interval(scores),
    )


def _verdict(a: Estimate, b: Estimate, higher_is_better: bool, min_calls: int) -> str:
    if a.n < min_calls or b.n < min_calls or a.value is None or b.value is None:
        return "not enough data yet"
    if a.high is not None and b.low is not None and a.high < b.low:
        return "B" if higher_is_better else "A"
    if b.high is not None and a.low is not None and b.high < a.low:
        return "A" if higher_is_better else "B"
    return "no difference yet"


def readout(calls: Iterable[ArmCall], min_calls: int = MIN_CALLS) -> list[Experiment]:
    """Per strategy that ran a B arm: each arm's measures and, per measure, which arm is better."""
    by: dict[str, dict[str, list[ArmCall]]] = {}
    for c in calls:
        by.setdefault(c.strategy, {}).setdefault(c.arm, []).append(c)
    out = []
    for strategy in sorted(by):
        arms = by[strategy]
        if "B" not in arms:
            continue  # no experiment ran on this strategy in the window
        readouts = tuple(_arm(name, arms.get(name, [])) for name in ("A", "B"))
        a, b = readouts
        verdicts = {m: _verdict(getattr(a, m), getattr(b, m), up, min_calls) for m, up in MEASURES}
        out.append(Experiment(strategy, readouts, verdicts))
    return out


def read_arm_calls(paths: Iterable[str | Path], since: float | None = None,
                   until: float | None = None) -> Iterator[ArmCall]:
    """Every call with an arm in the given metering stores, its feedback averaged, read-only."""
    for path in paths:
        p = Path(path)
        if not p.exists():
            raise FileNotFoundError(f"no metering database at {p}")
        conn = sqlite3.connect(f"file:{p}?mode=ro", uri=True)
        try:
            tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
            if "requests" not in tables:
                continue
            score = ("(SELECT AVG(f.score) FROM feedback f WHERE f.task_id = r.task_id AND f.tenant IS r.tenant)"
                     if "feedback" in tables else "NULL")
            q = (f"SELECT r.strategy, r.arm, r.status, r.latency_ms, r.ttft_ms, r.cost, {score} FROM requests r "
                 "WHERE r.arm IN ('A', 'B') AND r.ts >= ? AND r.ts < ?")
            args = (since if since is not None else float("-inf"), until if until is not None else float("inf"))
            for strategy, arm, status, latency, ttft, cost, s in conn.execute(q, args):
                yield ArmCall(strategy or "", arm, int(status or 0), float(latency or 0.0),
                              None if ttft is None else float(ttft), float(cost or 0.0),
                              None if s is None else float(s))
        finally:
            conn.close()


def render_table(experiments: Sequence[Experiment]) -> str:
    if not experiments:
        return "no A/B experiment in this window (routing.ab.share_b > 0 with weights_b for a strategy)\n"
    lines = []
    for e in experiments:
        lines.append(f"strategy {e.strategy}")
        head = ("measure", "A", "A 95% CI", "B", "B 95% CI", "better")
        rows = [head, ("requests", str(e.arms[0].requests), "", str(e.arms[1].requests), "", "")]
        for m, _ in MEASURES:
            a, b = getattr(e.arms[0], m), getattr(e.arms[1], m)
            rows.append((m, _fmt(a.value), _ci(a), _fmt(b.value), _ci(b), e.verdicts[m]))
        widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
        lines += ["  " + "  ".join(r[i].ljust(widths[i]) for i in range(len(head))).rstrip() for r in rows]
        lines.append("")
    return "\n".join(lines)


def _fmt(v: float | None) -> str:
    return "-" if v is None else f"{v:.4g}"


def _ci(e: Estimate) -> str:
    return "-" if e.value is None else f"[{_fmt(e.low)}, {_fmt(e.high)}]"
