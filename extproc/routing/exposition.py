"""Prometheus text exposition, one sample line at a time: the reader the DCGM watermark parser and
the model servers' replica readings (extproc/replicas/) share. Pure."""

from __future__ import annotations

import re

_SAMPLE = re.compile(r"^([A-Za-z_:][A-Za-z0-9_:]*)(?:\{(.*)\})?\s+(\S+)(?:\s+\S+)?\s*$")
_LABEL = re.compile(r'\s*([A-Za-z_][A-Za-z0-9_]*)\s*=\s*"((?:[^"\\]|\\.)*)"\s*,?')


def metric_name(line: str) -> str:
    """The metric name of a stripped, non-comment line, read without parsing the rest of it."""
    return line.split("{", 1)[0].split(None, 1)[0]


def sample(line: str, lineno: int, error: type[Exception], what: str) -> tuple[str, dict[str, str], float]:
    """(name, labels, value) of one stripped sample line; `error(f"{what} line N: ...")` when it is none."""
    m = _SAMPLE.match(line)
    if m is None:
        raise error(f"{what} line {lineno}: not a sample")
    try:
        value = float(m.group(3))
    except ValueError:
        raise error(f"{what} line {lineno}: bad value {m.group(3)!r}") from None
    return m.group(1), _labels(m.group(2) or "", lineno, error, what), value


def _labels(text: str, lineno: int, error: type[Exception], what: str) -> dict[str, str]:
    out: dict[str, str] = {}
    pos = 0
    while pos < len(text):
        m = _LABEL.match(text, pos)
        if m is None or m.end() == pos:
            if text[pos:].strip() in ("", ","):
                break
            raise error(f"{what} line {lineno}: bad labels")
        out[m.group(1)] = m.group(2).replace('\\"', '"').replace("\\n", "\n").replace("\\\\", "\\")
        pos = m.end()
    return out
