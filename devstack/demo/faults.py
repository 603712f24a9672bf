"""Faults a demo upstream injects on request, so tests can drive the gateway's error paths."""

from __future__ import annotations

FAIL = "demo-fail-500"  # answer 500 with an error body in the upstream's own shape
CUT = "demo-cut-stream"  # stream a few events, then end the response without the terminator


def fault_in(text: str) -> str | None:
    if FAIL in text:
        return FAIL
    if CUT in text:
        return CUT
    return None
