"""Latency in admission: the P99 of each deployment's recent calls, measured from the gateway's own
outcomes, held to the deployment's objective (`slo:`). Pure: the clock is passed in.

Over its objective a deployment counts as loaded at `slo.load`, a watermark, exactly where a GPU
watermark counts (fast-channel tiers, the load term). What decides is time-bounded: a sample older
than `window_s` no longer counts, and with fewer than `min_samples` left the deployment is not
judged (fail open), so a deployment nobody calls any more heals by the clock alone.
"""

from __future__ import annotations

import bisect
import math
from collections import deque
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass

from contracts.config.service_levels import LatencyObjective

# Samples kept per window, newest first out of the bound: memory stays flat under any load.
MAX_SAMPLES = 4096


class LatencyWindow:
    """Values of the last `window_s` seconds (at most `max_samples`), sorted as they come, so a
    percentile is one index; adding is a binary search and a list insert."""

    __slots__ = ("window_s", "max_samples", "_arrivals", "_sorted")

    def __init__(self, window_s: float, max_samples: int = MAX_SAMPLES) -> None:
        self.window_s = window_s
        self.max_samples = max_samples
        self._arrivals: deque[tuple[float, float]] = deque()
        self._sorted: list[float] = []

    def add(self, now: float, value: float) -> None:
        self.expire(now)
        if len(self._arrivals) >= self.max_samples:
            self._drop_oldest()
        self._arrivals.append((now, value))
        bisect.insort(self._sorted, value)

    def expire(self, now: float) -> None:
        cutoff = now - self.window_s
        while self._arrivals and self._arrivals[0][0] <= cutoff:
            self._drop_oldest()

    def _drop_oldest(self) -> None:
        _, value = self._arrivals.popleft()
        del self._sorted[bisect.bisect_left(self._sorted, value)]

    def count(self, now: float) -> int:
        self.expire(now)
        return len(self._sorted)

    def percentile(self, q: float, now: float) -> float | None:
        """Nearest rank: the smallest sample at or above a share `q` of the samples; None when empty."""
        self.expire(now)
        n = len(self._sorted)
        if not n:
            return None
        return self._sorted[max(0, math.ceil(q * n) - 1)]


@dataclass(frozen=True, slots=True)
class LatencyState:
    """One deployment against its objective now: what `route explain` shows."""

    p99_s: float | None  # whole answers; None: no sample in the window
    p99_samples: int
    ttft_s: float | None  # streams' time to first chunk
    ttft_samples: int
    over: str  # why it counts as loaded ("" when it does not)
    objective: LatencyObjective

    def to_json(self) -> dict[str, object]:
        o = self.objective
        return {"p99_ms": _ms(self.p99_s), "p99_samples": self.p99_samples, "ttft_ms": _ms(self.ttft_s),
                "ttft_samples": self.ttft_samples, "objective": {"p99_ms": o.p99_ms, "ttft_ms": o.ttft_ms},
                "window_s": o.window_s, "min_samples": o.min_samples, "over": self.over,
                "load": o.load if self.over else None}


def _ms(v: float | None) -> float | None:
    return None if v is None else round(v * 1000, 1)


def judge(o: LatencyObjective, p99_s: float | None, n99: int, ttft_s: float | None, nttft: int) -> str:
    """Why the measured P99s put a deployment over its objective; "" when they do not, or when too
    few calls were measured to say (fail open)."""
    if o.p99_ms is not None and p99_s is not None and n99 >= o.min_samples and p99_s * 1000 > o.p99_ms:
        return f"p99 {p99_s * 1000:.0f} ms over its {o.p99_ms:g} ms objective"
    if o.ttft_ms is not None and ttft_s is not None and nttft >= o.min_samples and ttft_s * 1000 > o.ttft_ms:
        return f"ttft p99 {ttft_s * 1000:.0f} ms over its {o.ttft_ms:g} ms objective"
    return ""


class LatencyBook:
    """Per deployment with an objective: a window of whole-answer latencies and one of TTFTs."""

    def __init__(self, objectives: Mapping[str, LatencyObjective]) -> None:
        self.objectives: dict[str, LatencyObjective] = {}
        self._whole: dict[str, LatencyWindow] = {}
        self._ttft: dict[str, LatencyWindow] = {}
        self.retune(objectives)

    def retune(self, objectives: Mapping[str, LatencyObjective]) -> None:
        """A reload: deployments that keep an objective keep their samples (a new window applies
        from the next reading); the others' go."""
        self.objectives = dict(objectives)
        for book in (self._whole, self._ttft):
            for cluster in list(book):
                o = self.objectives.get(cluster)
                if o is None:
                    del book[cluster]
                else:
                    book[cluster].window_s = o.window_s
        for cluster, o in self.objectives.items():
            self._whole.setdefault(cluster, LatencyWindow(o.window_s))
            self._ttft.setdefault(cluster, LatencyWindow(o.window_s))

    def record(self, cluster: str, latency_s: float, ttft_s: float | None, now: float) -> None:
        """One answered call: a stream (it had a first chunk) counts its TTFT, any other its latency."""
        if cluster not in self.objectives:
            return
        if ttft_s is not None:
            self._ttft[cluster].add(now, ttft_s)
        else:
            self._whole[cluster].add(now, latency_s)

    def state(self, cluster: str, now: float) -> LatencyState | None:
        o = self.objectives.get(cluster)
        if o is None:
            return None
        whole, ttft = self._whole[cluster], self._ttft[cluster]
        p99, n99 = whole.percentile(0.99, now), whole.count(now)
        t99, nt = ttft.percentile(0.99, now), ttft.count(now)
        return LatencyState(p99, n99, t99, nt, judge(o, p99, n99, t99, nt), o)

    def states(self, now: float) -> list[tuple[str, LatencyState]]:
        return [(c, st) for c in list(self.objectives) if (st := self.state(c, now)) is not None]

    def exposition(self, now: float) -> Iterator[tuple[str, dict[str, float]]]:
        """`modelyard_latency_objective`'s fields per deployment (the extproc's /metrics)."""
        for cluster, st in self.states(now):
            fields = {"p99_samples": float(st.p99_samples), "ttft_samples": float(st.ttft_samples),
                      "over": 1.0 if st.over else 0.0}
            if st.p99_s is not None:
                fields["p99_seconds"] = st.p99_s
            if st.ttft_s is not None:
                fields["ttft_seconds"] = st.ttft_s
            yield cluster, fields

    def loaded(self, now: float, clusters: Iterable[str] | None = None) -> dict[str, tuple[float, str]]:
        """cluster -> (the watermark it counts as, why) for each deployment over its objective now,
        among `clusters` (a decision's candidates: its cost follows them, not the config's size)."""
        out: dict[str, tuple[float, str]] = {}
        objectives = self.objectives
        for cluster in objectives if clusters is None else clusters:
            if cluster in objectives:
                st = self.state(cluster, now)
                if st is not None and st.over:
                    out[cluster] = (st.objective.load, st.over)
        return out


def from_exposition(objectives: Mapping[str, LatencyObjective],
                    fields: Mapping[str, Mapping[str, float]]) -> dict[str, LatencyState]:
    """The states a running extproc reported (`exposition`), judged against `objectives`."""
    out: dict[str, LatencyState] = {}
    for cluster, o in objectives.items():
        f = fields.get(cluster, {})
        p99, ttft = f.get("p99_seconds"), f.get("ttft_seconds")
        n99, nt = int(f.get("p99_samples", 0)), int(f.get("ttft_samples", 0))
        out[cluster] = LatencyState(p99, n99, ttft, nt, judge(o, p99, n99, ttft, nt), o)
    return out
