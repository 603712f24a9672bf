"""What a benchmark case's requests came back with, and whether that is a pass.

A case passes only when every request got one of the outcomes the case declares as expected
(by default HTTP 200). Throughput is computed from the expected ones alone, so a gateway that
answers fast 503s never looks fast.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field

# An HTTP status (int) or a named transport error / wrong answer ("read error", "wrong label").
Outcome = int | str


@dataclass
class Tally:
    """Outcome counts for one case of one bench."""

    bench: str
    case: str
    expected: frozenset[Outcome] = frozenset({200})
    counts: Counter[Outcome] = field(default_factory=Counter)

    def add(self, outcome: Outcome, n: int = 1) -> None:
        if n:
            self.counts[outcome] += n

    def merge(self, other: Tally) -> None:
        self.counts.update(other.counts)

    @property
    def ok(self) -> int:
        return sum(n for o, n in self.counts.items() if o in self.expected)

    @property
    def unexpected(self) -> dict[Outcome, int]:
        return {o: n for o, n in self.counts.items() if o not in self.expected and n}

    def failure(self) -> str | None:
        """`FAILED: <bench> <case>: <n> requests got <counts>`, or None when every outcome was expected."""
        bad = self.unexpected
        if not bad:
            return None
        return f"FAILED: {self.bench} {self.case}: {sum(bad.values())} requests got {format_counts(bad)}"


def format_counts(counts: dict[Outcome, int]) -> str:
    """`503 x12, read error x3`: statuses first in numeric order, then named errors."""
    order = sorted(counts, key=lambda o: (isinstance(o, str), str(o).zfill(3)))
    return ", ".join(f"{o} x{counts[o]}" for o in order)


def report(tallies: Iterable[Tally]) -> int:
    """Print one FAILED line per failing case; the process exit code (1 if any failed)."""
    failed = [line for t in tallies if (line := t.failure())]
    for line in failed:
        print(line, flush=True)
    return 1 if failed else 0
