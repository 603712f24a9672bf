"""Generated traffic for the tuner's tests: bursty, diurnal, and one noisy tenant among quiet ones."""

from __future__ import annotations

import math
import random

TENANTS = {"acme": "L1", "globex": "L2", "noisy": "L3", "quiet": "L3"}


def _row(t: float, tenant: str, rng: random.Random, cluster: str | None = None) -> dict:
    return {"timestamp": round(t, 6), "tenant": tenant, "tier": TENANTS[tenant],
            "cluster": cluster or rng.choice(["gpu-a", "gpu-b"]), "channel": rng.choice(["standard", "fast"]),
            "model": rng.choice(["m1", "m2"]), "tokens": rng.randint(20, 900)}


def bursty(n: int = 3000, seed: int = 1) -> list[dict]:
    """Poisson arrivals with one request in ten starting a short salvo."""
    rng = random.Random(seed)
    t, rows = 1_700_000_000.0, []
    while len(rows) < n:
        t += rng.expovariate(8)
        tenant = rng.choice(list(TENANTS))
        for _ in range(rng.randint(2, 8) if rng.random() < 0.1 else 1):
            rows.append(_row(t, tenant, rng))
            t += rng.expovariate(200)
    return rows[:n]


def diurnal(n: int = 3000, seed: int = 2) -> list[dict]:
    """A rate that swings 10x over a (compressed, 10-minute) day."""
    rng = random.Random(seed)
    t, rows = 0.0, []
    while len(rows) < n:
        rate = 2 + 18 * (1 + math.sin(2 * math.pi * t / 600)) / 2
        t += rng.expovariate(rate)
        rows.append(_row(t, rng.choice(list(TENANTS)), rng))
    return rows


def noisy_tenant(n: int = 3000, seed: int = 3) -> list[dict]:
    """Three steady tenants, and one that sends 40 requests at once every 30 s."""
    rng = random.Random(seed)
    t, rows, next_storm = 0.0, [], 5.0
    while len(rows) < n:
        t += rng.expovariate(6)
        if t >= next_storm:
            for i in range(40):
                rows.append(_row(next_storm + i * 0.002, "noisy", rng, "gpu-a"))
            next_storm += 30
        rows.append(_row(t, rng.choice(["acme", "globex", "quiet"]), rng))
    rows.sort(key=lambda r: r["timestamp"])
    return rows[:n]


ALL = {"bursty": bursty, "diurnal": diurnal, "noisy": noisy_tenant}


def csv_text(rows: list[dict]) -> str:
    cols = ["timestamp", "tenant", "tier", "cluster", "channel", "model", "tokens"]
    return ",".join(cols) + "\n" + "".join(",".join(str(r[c]) for c in cols) + "\n" for r in rows)
