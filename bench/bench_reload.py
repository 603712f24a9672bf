"""A live reload's cost (extproc/live/reload.py) on the demo config, against parsing the same file in the same run:
the whole apply (parse in a worker thread, then prepare and commit), and the part that runs on the event
loop (prepare + commit: the only time requests wait on a reload). Alternates two configs so every apply
changes something (a tenant added, then removed)."""

from __future__ import annotations

import asyncio
import copy
import statistics
import sys
import time
from pathlib import Path

import orjson
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.smoke import scaled  # noqa: E402
from contracts.config import hash_api_key, parse_config  # noqa: E402
from contracts.live_config import config_version  # noqa: E402
from extproc.gateway import Gateway, LiveGateway  # noqa: E402
from extproc.live.reload import Reloader, commit, parse_text, prepare  # noqa: E402
from ratelimit import Limiter  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent


def _texts() -> list[bytes]:
    data = yaml.safe_load((ROOT / "modelyard.yaml").read_text())
    for m in data["models"]:  # no agents run here
        for d in m["deployments"]:
            d.pop("watermark", None)
    more = copy.deepcopy(data)
    more["tenants"].append({"name": "bench", "api_keys": [hash_api_key("sk-bench")]})
    return [yaml.safe_dump(d, sort_keys=False).encode() for d in (more, data)]


async def run(n: int) -> list[dict[str, object]]:
    texts = _texts()
    config = parse_config(yaml.safe_load(texts[1]))
    live = LiveGateway(Gateway.build(config, limiter=Limiter(config.ratelimit)), config_version(texts[1]))
    reloader = Reloader(live)
    parse_s, apply_s, loop_s = [], [], []
    for i in range(n):
        text = texts[i % 2]
        t0 = time.perf_counter()
        parsed = parse_text(text, "bench")
        parse_s.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        commit(live, prepare(live.current, parsed), config_version(text))
        loop_s.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        out = await reloader.apply_text(texts[(i + 1) % 2], source="bench", origin="bench")
        apply_s.append(time.perf_counter() - t0)
        if not out.ok:
            print(f"FAILED: reload refused: {out.error}")
            raise SystemExit(1)
    base = statistics.median(parse_s)
    rows = []
    for case, xs in (("parse + validate (baseline)", parse_s), ("reload: whole apply", apply_s),
                     ("reload: on the event loop", loop_s)):
        ms = statistics.median(xs) * 1000
        rows.append({"bench": "reload", "case": case, "metric": "median_time", "value": round(ms, 2), "unit": "ms",
                     "ratio": round(ms / 1000 / base, 3)})
    return rows


def main() -> int:
    n = scaled(200, 6)
    rows = asyncio.run(run(n))
    print(f"{n} reloads of the demo config (median)")
    print(f"{'case':<32} {'ms':>8} {'vs parse':>9}")
    for r in rows:
        print(f"{r['case']:<32} {r['value']:>8} {r['ratio']:>9.3f}")
    print("SUMMARY " + orjson.dumps(rows).decode())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
