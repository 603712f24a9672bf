"""Virtual keys: what a store key costs the auth step, and how soon a store change reaches a worker.

`identify` cases: one `KeyRing.identify` per call for a config-file key (the baseline: what every
request paid before the store), a store key, and a store key that narrows its tenant's models; 10,000
store keys in the cache. `propagation`: a create and a revoke written on another connection (as the
CLI or another replica writes), timed until the refresher's cache has them, on SQLite at the
default `keys.refresh_s` (0.5 s); the ratio is to that period (the bound is one period plus a read).
`miss`: a key created on another connection, asked at its first call (`KeyRing.look_up`: the lookup
thread's indexed read, the copy's apply, the identify), against a cached key's `identify`.
"""

from __future__ import annotations

import asyncio
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import yaml  # noqa: E402

from bench import scratch  # noqa: E402
from bench.smoke import scaled  # noqa: E402
from contracts.config import parse_config  # noqa: E402
from extproc.admission.auth import Identity, KeyRing  # noqa: E402
from extproc.key_admin import KeyAdmin  # noqa: E402
from keys.cache import KeyCache  # noqa: E402
from keys.db import connect  # noqa: E402
from keys.refresher import KeyRefresher  # noqa: E402
from keys.secret import digest_of  # noqa: E402
from keys.spec import KeySpec  # noqa: E402
from keys.store import KeyStore  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
REFRESH_S = 0.5


def _median_us(fn, n: int) -> float:
    samples = []
    for _ in range(n):
        t0 = time.perf_counter_ns()
        fn()
        samples.append(time.perf_counter_ns() - t0)
    return statistics.median(samples) / 1000.0


def identify_rows() -> list[dict]:
    cfg = parse_config(yaml.safe_load((ROOT / "modelyard.yaml").read_text()))
    cache = KeyCache()
    store = KeyStore(connect("sqlite:///:memory:"))
    for _ in range(scaled(10_000, 200)):
        store.create(KeySpec(tenant="demo"))
    _, wide = store.create(KeySpec(tenant="demo"))
    _, narrow = store.create(KeySpec(tenant="demo", models=("demo-gpt", "demo-mini")))
    cache.apply(store.changed_since(0))
    ring = KeyRing(cfg.tenants, cache)
    reps = scaled(20_000, 200)
    cases = (("config", "sk-modelyard-demo"), ("store", wide), ("store-narrowed", narrow))
    for _, key in cases:
        assert isinstance(ring.identify(key), Identity)
    # Rounds interleave the cases, so a noisy neighbour slows them alike; each case's median of rounds.
    rounds: dict[str, list[float]] = {case: [] for case, _ in cases}
    for _ in range(5):
        for case, key in cases:
            rounds[case].append(_median_us(lambda key=key: ring.identify(key), reps // 5))
    base = statistics.median(rounds["config"])
    rows = []
    for case, _ in cases:
        us = statistics.median(rounds[case])
        print(f"identify {case:<16} {us:>8.2f} us  {us / base:>5.2f}x")
        rows.append({"bench": "keys", "case": f"identify-{case}", "metric": "identify_median", "value": round(us, 3),
                     "unit": "us", "baseline": round(base, 3), "ratio": round(us / base, 2)})
    return rows


def propagation_rows() -> list[dict]:
    dsn = f"sqlite:///{scratch.folder('bench-keys-')}/keys.db"
    cache = KeyCache()
    refresher = KeyRefresher(lambda: KeyStore(connect(dsn)), cache, REFRESH_S)
    refresher.start()
    assert refresher.wait_loaded(10)
    writer = KeyStore(connect(dsn))
    created, revoked = [], []
    try:
        for i in range(scaled(20, 3)):
            time.sleep((i % 5) * REFRESH_S / 5)  # spread writes over the refresh phase
            rec, secret = writer.create(KeySpec(tenant="demo"))
            t0 = time.monotonic()
            while cache.lookup(digest_of(secret)) is None:
                time.sleep(0.002)
            created.append(time.monotonic() - t0)
            writer.revoke(rec.id)
            t0 = time.monotonic()
            while cache.lookup(digest_of(secret)) is not None:
                time.sleep(0.002)
            revoked.append(time.monotonic() - t0)
    finally:
        refresher.stop()
        writer.close()
    rows = []
    for case, xs in (("create", created), ("revoke", revoked)):
        worst_ms, median_ms = max(xs) * 1000, statistics.median(xs) * 1000
        print(f"propagation {case:<8} median {median_ms:>6.0f} ms  max {worst_ms:>6.0f} ms  (refresh {REFRESH_S} s)")
        rows.append({"bench": "keys", "case": f"propagation-{case}", "metric": "max_delay", "value": round(worst_ms, 1),
                     "unit": "ms", "baseline": REFRESH_S * 1000, "ratio": round(worst_ms / (REFRESH_S * 1000), 2),
                     "median_ms": round(median_ms, 1)})
    return rows


def miss_rows() -> list[dict]:
    data = yaml.safe_load((ROOT / "modelyard.yaml").read_text())
    data["keys"] = {"lookup_burst": 100_000}
    cfg = parse_config(data)
    dsn = f"sqlite:///{scratch.folder('bench-keys-')}/keys.db"
    writer = KeyStore(connect(dsn))
    secrets = [writer.create(KeySpec(tenant="demo"))[1] for _ in range(scaled(500, 20))]
    writer.close()
    copy = KeyCache()
    copy.loaded = True  # as of a refresh before these keys were created: every one of them is a miss
    admin = KeyAdmin(cfg, dsn, copy, None)
    ring = KeyRing(cfg.tenants, admin.cache, admin)

    async def first_calls() -> list[int]:
        await ring.look_up(digest_of("my-warm-up"))  # the lookup thread's connection opens here
        samples: list[int] = []  # nanoseconds
        for secret in secrets:
            t0 = time.perf_counter_ns()
            assert isinstance(await ring.look_up(digest_of(secret)), Identity)
            samples.append(time.perf_counter_ns() - t0)
        await admin.close()
        return samples

    samples = asyncio.run(first_calls())
    hit = _median_us(lambda: ring.identify(secrets[0]), scaled(5_000, 100))
    us = statistics.median(samples) / 1000.0
    p99 = sorted(samples)[int(len(samples) * 0.99)] / 1000.0
    print(f"miss lookup (SQLite) median {us:>7.1f} us  p99 {p99:>7.1f} us  (cached identify {hit:.2f} us)")
    return [{"bench": "keys", "case": "miss-lookup-sqlite", "metric": "first_call_median", "value": round(us, 1),
             "unit": "us", "baseline": round(hit, 3), "ratio": round(us / hit, 1), "p99_us": round(p99, 1)}]


def main() -> int:
    rows = identify_rows() + propagation_rows() + miss_rows()
    print("SUMMARY " + json.dumps(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(scratch.run(main))
