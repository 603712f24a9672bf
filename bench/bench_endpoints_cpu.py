"""Extproc CPU per request by endpoint: chat, the Responses API and embeddings, each to an
OpenAI-speaking and a non-OpenAI demo upstream, through a real stack (the shipped demo config on
free ports, metering off).

    .venv/bin/python bench/bench_endpoints_cpu.py [--requests N]

CPU per request is the extproc process's CPU-time delta (/proc, user + system) over N sequential
requests after a warm-up: steadier than req/s on a shared machine. Linux only. Any status but 200
(or a transport error) fails the bench with a `FAILED:` line.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.outcomes import Tally, report  # noqa: E402
from bench.proc_cpu import cpu_seconds  # noqa: E402
from bench.smoke import scaled  # noqa: E402
from tests.conftest import DEMO_KEY, UPSTREAM_KEYS  # noqa: E402
from tests.stack_config import demo_config_free_ports, start_stack  # noqa: E402

CASES: dict[str, tuple[str, dict]] = {
    "chat, OpenAI client -> OpenAI upstream (passthrough)":
        ("/v1/chat/completions", {"model": "demo-gpt", "messages": [{"role": "user", "content": "hello there"}]}),
    "chat, OpenAI client -> Anthropic upstream":
        ("/v1/chat/completions", {"model": "demo-claude", "messages": [{"role": "user", "content": "hello there"}]}),
    "responses -> OpenAI upstream": ("/v1/responses", {"model": "demo-gpt", "input": "hello there"}),
    "responses -> Anthropic upstream": ("/v1/responses", {"model": "demo-claude", "input": "hello there"}),
    "responses, streamed -> OpenAI upstream":
        ("/v1/responses", {"model": "demo-gpt", "input": "hello there", "stream": True}),
    "embeddings -> OpenAI upstream (passthrough)":
        ("/v1/embeddings", {"model": "demo-embed", "input": ["a b", "c d"], "encoding_format": "base64"}),
    "embeddings -> Gemini upstream":
        ("/v1/embeddings", {"model": "demo-embed-gemini", "input": ["a b", "c d"], "encoding_format": "base64"}),
}




def _post(c: httpx.Client, path: str, body: dict, tally: Tally) -> None:
    try:
        tally.add(c.post(path, json=body).status_code)
    except httpx.HTTPError as e:
        tally.add(type(e).__name__)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--requests", type=int, default=scaled(300, 10))
    n = p.parse_args().requests
    tallies: list[Tally] = []
    rows: list[dict] = []
    for name, value in UPSTREAM_KEYS.items():
        os.environ.setdefault(name, value)
    data, _ = demo_config_free_ports()
    data["extproc"]["metering_db"] = None
    with tempfile.TemporaryDirectory() as d, start_stack(Path(d), data) as stack:
        proc = stack.child("extproc").proc
        assert proc is not None
        with httpx.Client(base_url=stack.url, headers={"authorization": f"Bearer {DEMO_KEY}"}, timeout=10) as c:
            for label, (path, body) in CASES.items():
                tallies.append(Tally("endpoints", f"{label} warm-up"))
                for _ in range(scaled(30, 3)):
                    _post(c, path, body, tallies[-1])
                tallies.append(Tally("endpoints", label))
                cpu0, wall0 = cpu_seconds(proc.pid), time.perf_counter()
                for _ in range(n):
                    _post(c, path, body, tallies[-1])
                cpu, wall = cpu_seconds(proc.pid) - cpu0, time.perf_counter() - wall0
                print(f"{label:55s} extproc CPU {cpu / n * 1e6:6.0f} us/req   wall {wall / n * 1e3:5.2f} ms/req")
                rows.append({"bench": "endpoints", "case": label, "metric": "extproc_cpu",
                             "value": round(cpu / n * 1e6, 1), "unit": "us/req"})
    print("SUMMARY " + json.dumps(rows))
    return report(tallies)


if __name__ == "__main__":
    raise SystemExit(main())
