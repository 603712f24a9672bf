"""A small reader of Prometheus text exposition: the samples of the metric names asked for."""

from __future__ import annotations

import math
import re
from collections.abc import Container, Iterator

from contracts.errors import UpstreamError

_SAMPLE = re.compile(r"^([A-Za-z_:][A-Za-z0-9_:]*)(?:\{(.*)\})?\s+(\S+)(?:\s+\S+)?\s*$")
_LABEL = re.compile(r'\s*([A-Za-z_][A-Za-z0-9_]*)\s*=\s*"((?:[^"\\]|\\.)*)"\s*,?')


class MetricsParseError(UpstreamError):
    """A replica's /metrics that is not Prometheus text, or lacks what its kind must report."""


def _labels(text: str, lineno: int) -> dict[str, str]:
    out: dict[str, str] = {}
    pos = 0
    while pos < len(text):
        m = _LABEL.match(text, pos)
        if m is None or m.end() == pos:
            if text[pos:].strip() in ("", ","):
                break
            raise MetricsParseError(f"metrics line {lineno}: bad labels")
        out[m.group(1)] = m.group(2).replace('\\"', '"').replace("\\n", "\n").replace("\\\\", "\\")
        pos = m.end()
    return out


def samples(text: bytes | str, names: Container[str]) -> Iterator[tuple[str, dict[str, str], float]]:
    """(name, labels, value) of every sample whose name is in `names`; other lines are skipped
    unparsed (a vLLM exposition is mostly histograms nobody here reads)."""
    if isinstance(text, bytes):
        text = text.decode("utf-8", "replace")
    for lineno, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        name = line.split("{", 1)[0].split(None, 1)[0]
        if name not in names:
            continue
        m = _SAMPLE.match(line)
        if m is None:
            raise MetricsParseError(f"metrics line {lineno}: not a sample")
        try:
            value = float(m.group(3))
        except ValueError:
            raise MetricsParseError(f"metrics line {lineno}: bad value {m.group(3)!r}") from None
        if math.isnan(value):
            continue  # Prometheus' "no value": as if absent
        yield name, _labels(m.group(2) or "", lineno), value
