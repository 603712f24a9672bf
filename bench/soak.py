"""Soak: the shipped modelyard.yaml (every feature it turns on) through a devstack stack on free
ports, at a steady moderate load for --minutes (default 30), recording what grows.

Load: --rps requests a second (default 30), paced, interleaving OpenAI chat, OpenAI streams,
Anthropic messages, embeddings, KServe v2 infer and an async task now and then, over three
tenants' keys (httpx with its default headers). Every --sample-s (default 60) and at start and
end one JSON line: RSS (KiB) and open fds of the extproc and of Envoy, the run dir's store sizes
(bytes, each database with its -wal and journals: metering, audit, tasks) and the requests sent
and failed so far. The last line, `SUMMARY`, is the growth start -> end.

    .venv/bin/python bench/soak.py --minutes 3
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.conftest import DEMO_KEY, UPSTREAM_KEYS  # noqa: E402
from tests.stack_config import demo_config_free_ports, start_stack  # noqa: E402

KEYS = [DEMO_KEY, "sk-modelyard-demo-l2", "sk-modelyard-demo-l3"]
L3_MODELS = {"demo-gpt", "demo-mini"}  # demo-l3's allowed models (the shipped config): it sends only these
_PIXELS = [0.5] * (3 * 8 * 8)
# (name, method, path, body, stream); the mix repeats in this order, one request per tick.
MIX: list[tuple[str, str, dict, bool]] = [
    ("chat", "/v1/chat/completions", {"model": "demo-gpt", "messages": [{"role": "user", "content": "soak"}]}, False),
    ("stream", "/v1/chat/completions",
     {"model": "demo-gpt", "stream": True, "messages": [{"role": "user", "content": "soak a stream"}]}, True),
    ("embeddings", "/v1/embeddings", {"model": "demo-embed", "input": ["soak one", "soak two"]}, False),
    ("kserve", "/v2/models/demo-colors/infer",
     {"inputs": [{"name": "input", "datatype": "FP32", "shape": [1, 3, 8, 8], "data": _PIXELS}]}, False),
    ("anthropic", "/v1/messages",
     {"model": "demo-claude", "max_tokens": 64, "messages": [{"role": "user", "content": "soak"}]}, False),
    ("chat-mini", "/v1/chat/completions",
     {"model": "demo-mini", "messages": [{"role": "user", "content": "soak mini"}]}, False),
]
ASYNC_EVERY = 50  # one chat in this many asks for Prefer: respond-async (the task store)


def _status(pid: int) -> tuple[int, int]:
    rss = next(int(ln.split()[1]) for ln in Path(f"/proc/{pid}/status").read_text().splitlines()
               if ln.startswith("VmRSS:"))
    return rss, len(os.listdir(f"/proc/{pid}/fd"))


def _store_bytes(workdir: Path, name: str) -> int:
    """A database with its -wal, -shm and crash journals."""
    return sum(p.stat().st_size for p in workdir.glob(f"{name}*") if p.is_file())


async def _one(c: httpx.AsyncClient, n: int, tally: Counter[str]) -> None:
    name, path, body, stream = MIX[n % len(MIX)]
    keys = KEYS if body.get("model") in L3_MODELS else KEYS[:2]
    key = keys[(n // len(MIX)) % len(keys)]  # each kind of request rotates through the tenants
    headers = {"authorization": f"Bearer {key}"}
    if name == "anthropic":
        headers = {"x-api-key": key, "anthropic-version": "2023-06-01"}
    if name == "chat" and n % ASYNC_EVERY == 0:
        headers["prefer"] = "respond-async"
        name = "async"
    try:
        async with c.stream("POST", path, json=body, headers=headers) as r:
            text = b"".join([chunk async for chunk in r.aiter_bytes()])
        ok = r.status_code == (202 if name == "async" else 200) and (not stream or b"[DONE]" in text)
        tally[f"{name} {'ok' if ok else r.status_code}"] += 1
    except httpx.HTTPError as e:
        tally[f"{name} {type(e).__name__}"] += 1


async def _load(url: str, rps: float, seconds: float, tally: Counter[str], sample, sample_s: float) -> None:
    """One request every 1/rps seconds (a paced schedule, not a closed loop), sampling as it goes."""
    pending: set[asyncio.Task[None]] = set()
    start = time.monotonic()
    next_sample = start + sample_s
    async with httpx.AsyncClient(base_url=url, timeout=30) as c:
        for n in itertools.count():
            at = start + n / rps
            if at - start >= seconds:
                break
            now = time.monotonic()
            if now >= next_sample:
                await asyncio.to_thread(sample)
                next_sample += sample_s
            if at > now:
                await asyncio.sleep(at - now)
            task = asyncio.create_task(_one(c, n, tally))
            pending.add(task)
            task.add_done_callback(pending.discard)
        await asyncio.gather(*pending)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--minutes", type=float, default=30.0)
    p.add_argument("--rps", type=float, default=30.0)
    p.add_argument("--sample-s", type=float, default=60.0)
    args = p.parse_args()
    for name, value in UPSTREAM_KEYS.items():
        os.environ.setdefault(name, value)
    data, _ = demo_config_free_ports()
    tally: Counter[str] = Counter()
    samples: list[dict] = []
    with tempfile.TemporaryDirectory() as d, start_stack(Path(d), data) as stack:
        work = Path(d)
        pids = {name: stack.child(name).proc.pid for name in ("extproc", "envoy")}
        t0 = time.monotonic()

        def sample() -> None:
            row: dict[str, object] = {"t_s": round(time.monotonic() - t0, 1)}
            for name, pid in pids.items():
                row[f"{name}_rss_kib"], row[f"{name}_fds"] = _status(pid)
            for store in ("metering", "audit", "tasks"):
                row[f"{store}_bytes"] = _store_bytes(work, f"{store}.sqlite")
            row["sent"] = sum(tally.values())
            row["failed"] = sum(v for k, v in tally.items() if not k.endswith(" ok"))
            samples.append(row)
            print(json.dumps(row), flush=True)

        sample()
        asyncio.run(_load(stack.url, args.rps, args.minutes * 60, tally, sample, args.sample_s))
        time.sleep(1.0)  # the writers' last batches land before the final sizes
        sample()
    first, last = samples[0], samples[-1]
    growth = {k: last[k] - first[k] for k in first if k not in ("t_s", "sent", "failed")}
    print("TALLY " + json.dumps(dict(sorted(tally.items()))))
    print("SUMMARY " + json.dumps({"minutes": args.minutes, "rps": args.rps, "sent": last["sent"],
                                   "failed": last["failed"], "growth": growth}))
    return 0 if last["failed"] == 0 else 1


if __name__ == "__main__":
    raise SystemExit(main())
