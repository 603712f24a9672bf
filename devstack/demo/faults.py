"""Faults a demo upstream injects on request, so tests can drive the gateway's error paths."""

from __future__ import annotations

FAIL = "demo-fail-500"  # answer 500 with an error body in the upstream's own shape
CUT = "demo-cut-stream"  # stream a few events, then end the response without the terminator
SLOW = "demo-slow"  # wait SLOW_SECONDS before answering: longer than the chaos deployments' timeout
GARBAGE = "demo-garbage"  # answer 200 with bytes that are no protocol's reply
TRACE = "demo-fail-traceback"  # answer 500 with a Python traceback as text, like a server in debug mode

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
