"""Faults a demo upstream injects on request, so tests can drive the gateway's error paths."""

from __future__ import annotations

import re

FAIL = "demo-fail-500"  # answer 500 with an error body in the upstream's own shape
CUT = "demo-cut-stream"  # stream a few events, then end the response without the terminator
SLOW = "demo-slow"  # wait SLOW_SECONDS before answering: longer than the chaos deployments' timeout
GARBAGE = "demo-garbage"  # answer 200 with bytes that are no protocol's reply
TRACE = "demo-fail-traceback"  # answer 500 with a Python traceback as text, like a server in debug mode
BAD_INPUT = "demo-bad-400"  # an embedding input the upstream refuses (400), as a real one refuses a bad input

# "demo-hold-250": hold the answer 250 ms (at most HOLD_MAX_MS), so tests can keep a slot busy.
_HOLD = re.compile(r"demo-hold-(\d{1,5})")
HOLD_MAX_MS = 10_000

SLOW_SECONDS = 5.0  # short enough that a stopping demo server is not held up long
GARBAGE_BODY = b"\x00\xffnot json <html>stack trace at upstream.internal:8443</html>"
TRACEBACK = """Traceback (most recent call last):
  File "/opt/demo/venv/lib/python3.11/site-packages/demo_server/handlers.py", line 42, in generate
    weights = load_shard("/mnt/weights/demo-70b/shard-00003.safetensors")
RuntimeError: CUDA out of memory (demo traceback)
"""


def fault_in(text: str) -> str | None:
    for fault in (TRACE, FAIL, CUT, SLOW, GARBAGE):
        if fault in text:
            return fault
    return None


def hold_seconds(text: str) -> float:
    """How long a `demo-hold-MS` in the text asks the upstream to wait before answering."""
    m = _HOLD.search(text)
    return min(int(m[1]), HOLD_MAX_MS) / 1000.0 if m else 0.0
