"""A small reader of Prometheus text exposition: the samples of the metric names asked for."""

from __future__ import annotations

import math
from collections.abc import Container, Iterator

from contracts.errors import UpstreamError
from extproc.routing.exposition import metric_name, sample


class MetricsParseError(UpstreamError):
    """A replica's /metrics that is not Prometheus text, or lacks what its kind must report."""


def samples(text: bytes | str, names: Container[str]) -> Iterator[tuple[str, dict[str, str], float]]:
    """(name, labels, value) of every sample whose name is in `names`; other lines are skipped
    unparsed (a vLLM exposition is mostly histograms nobody here reads)."""
    if isinstance(text, bytes):
        text = text.decode("utf-8", "replace")
    for lineno, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if metric_name(line) not in names:
            continue
        name, labels, value = sample(line, lineno, MetricsParseError, "metrics")
        if math.isnan(value):
            continue  # Prometheus' "no value": as if absent
        yield name, labels, value
