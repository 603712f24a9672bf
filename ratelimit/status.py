"""`modelyard ratelimit status`: a running extproc's buckets and recent refusals.

The extproc mounts `add_to_server` on its gRPC server (the port Envoy's ext_proc and the RLS
already use): one unary method, `/modelyard.ratelimit.Status/Get`, JSON in and out, no proto.
It reports the buckets this process has charged, each at its level now (read from Redis when
that is the store, without writing; else from memory), and the refusals of the last `window_s`
seconds per bucket. With several replicas on one Redis, the levels are the shared ones and
the refusals those of the replica that answered.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import Counter
from typing import Any

import grpc
import orjson
import yaml

from contracts.grpc_services import ServiceTable

from .bucket import MILLI, NANO
from .limiter import Limiter

SERVICE = "modelyard.ratelimit.Status"
METHOD = f"/{SERVICE}/Get"


async def snapshot(limiter: Limiter, window_s: float = 60.0) -> dict[str, Any]:
    charges = sorted(limiter.seen.values(), key=lambda c: c.key)
    levels = await limiter.levels(charges)
    now = time.time()
    recent: Counter[str] = Counter()
    last: dict[str, float] = {}
    for ts, key in limiter.refusals:
        last[key] = ts
        if now - ts <= window_s:
            recent[key] += 1
    buckets = []
    for c, lv in zip(charges, levels):
        buckets.append({"key": c.key, "scope": c.scope, "unit": c.unit, "rate": c.params.rate_milli / MILLI,
                        "burst": c.params.burst_nano / NANO, "level": lv / NANO,
                        "refusals": recent.get(c.key, 0),
                        "last_refusal_s_ago": round(now - last[c.key], 3) if c.key in last else None})
    cfg = limiter.config
    return {"backend": cfg.backend, "degraded": limiter.degraded, "enabled": cfg.enabled, "window_s": window_s,
            "refusals": sum(recent.values()), "buckets": buckets}


def add_to_server(server: ServiceTable, limiter: Limiter) -> None:
    async def get(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
        try:
            window = float(orjson.loads(request or b"{}").get("window_s", 60))
        except (orjson.JSONDecodeError, AttributeError, TypeError, ValueError):
            window = 60.0
        return orjson.dumps(await snapshot(limiter, window))

    handler: grpc.RpcMethodHandler[bytes, bytes] = grpc.unary_unary_rpc_method_handler(get)  # raw bytes
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, {"Get": handler}),))


def fetch(address: str, window_s: float = 60.0, timeout_s: float = 5.0) -> dict[str, Any]:
    with grpc.insecure_channel(address) as ch:
        call: grpc.UnaryUnaryMultiCallable[bytes, bytes] = ch.unary_unary(METHOD)
        raw: bytes = call(orjson.dumps({"window_s": window_s}), timeout=timeout_s)
    out: dict[str, Any] = orjson.loads(raw)
    return out


def format_status(s: dict[str, Any]) -> str:
    head = f"backend {s['backend']}{' (DEGRADED: Redis down)' if s['degraded'] else ''}; " \
           f"{len(s['buckets'])} buckets; {s['refusals']} refusals in the last {s['window_s']:g}s"
    rows = [["bucket", "rate/s", "burst", "level", "full", "refusals", "last refusal"]]
    for b in s["buckets"]:
        last = "-" if b["last_refusal_s_ago"] is None else f"{b['last_refusal_s_ago']:.1f}s ago"
        rows.append([b["key"], f"{b['rate']:g}", f"{b['burst']:g}", f"{b['level']:.3f}".rstrip("0").rstrip("."),
                     f"{max(0.0, b['level']) / b['burst']:.0%}", str(b["refusals"]), last])
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return head + "\n" + "\n".join(lines)


def _address(config: str | None) -> str:
    if config:
        with open(config) as f:
            raw = yaml.safe_load(f) or {}
        addr = (raw.get("extproc") or {}).get("address")
        if addr:
            return str(addr)
    return "127.0.0.1:50051"


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="modelyard ratelimit status", description=__doc__.splitlines()[0])
    p.add_argument("--address", help="the extproc's gRPC address (default: --config's extproc.address)")
    p.add_argument("--config", "-c", help="modelyard.yaml, for the address")
    p.add_argument("--window", type=float, default=60.0, help="count refusals of the last N seconds")
    p.add_argument("--json", action="store_true")
    try:
        a = p.parse_args(argv)
        addr = a.address or _address(a.config)
    except SystemExit as e:
        return int(e.code or 0)
    except (OSError, yaml.YAMLError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    try:
        s = fetch(addr, a.window)
    except grpc.RpcError as e:
        print(f"error: {addr}: {e.code().name}: {e.details()}", file=sys.stderr)
        return 1
    print(orjson.dumps(s, option=orjson.OPT_INDENT_2).decode() if a.json else format_status(s))
    return 0
