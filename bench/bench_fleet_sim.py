"""The replica benchmark's fleet and workload in simulated time: no sockets, no event loop, no box.

    .venv/bin/python bench/bench_fleet_sim.py [--rates 8,12,16,20,24,32] [--duration 20] [--seeds 0,1,2]
        [--policies round_robin,least_request,picker] [--variants 'NAME=JSON;...'] [--json FILE]

The same engines as the live fleet (devstack/fleet/engine.py with bench_replicas.py's FLEET_ARGS),
the same workload (bench/fleet_load.py's `Workload`: Poisson arrivals, conversations that continue
once their answer is in) and the picker's own code (`pick_replica`, `PrefixIndex`), fed readings
scraped every `interval_ms` (each replica at its own phase) while its in-flight count moves at once,
as the gateway sees them. A run takes about a second and the same seed gives the same result to
the token, so a ratio between policies here is the policies' own, with none of the busy box's noise
(bench_replicas.py's `late_s`); bench_replicas.py then checks through Envoy what this finds. Seed s
at rate r is bench_replicas.py's workload `1000 s + 10 r` (its `--same-seed` runs are seed 0).

Per policy and rate, medians over the seeds: output tokens/s (over the first arrival to the last
finish, as bench_replicas.py), the steady-state rate (tokens made while arrivals last, past their
first quarter), TTFT p50/p99 at the replicas, preemptions, the prefix-hit share, the running batch
and KV use averaged over steps, and (first seed) calls per replica and when each went idle.

`--variants` adds pickers with other `replica_metrics` settings, and experiments that are not
settings (docs/routing.md, "Why 1.2-1.3x"): `"_load": "inflight" | "work" | "delta"` (what the
picker counts as a replica's queue: the gateway's own in-flight alone; its in-flight output tokens
in mean calls; the last scrape plus the calls sent since it, instead of scrape + in-flight),
`"_cap": N` (a gateway-side queue: at most N calls in flight per replica, the rest held in order)
with `"_pull": K` (a replica with room takes the held call of the first K its prefix index serves
best), and `"_oracle": eps` (a ceiling, not a router: the replicas' true caches and queues, no
scrape lag, the most cached blocks within bounded.py's load bound).
"""

from __future__ import annotations

import argparse
import dataclasses
import heapq
import itertools
import json
import random
import statistics
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.fleet_load import Conversation, Workload, WorkloadSpec, pct  # noqa: E402
from bench.smoke import SMOKE, scaled  # noqa: E402
from contracts.config.balancing import ReplicaMetrics  # noqa: E402
from devstack.fleet.engine import Engine, EngineSpec, SimRequest, chain_hashes  # noqa: E402
from extproc.replicas.bounded import load_bound  # noqa: E402
from extproc.replicas.picker import pick_replica  # noqa: E402
from extproc.replicas.prefix import PrefixIndex, block_hashes  # noqa: E402
from extproc.replicas.readings import ReplicaReading  # noqa: E402

# bench_replicas.py's FLEET_ARGS, as an EngineSpec.
FLEET = EngineSpec(kv_blocks=1536, block_tokens=16, max_running=48, prefill_budget=2048, decode_base_ms=20.0,
                   decode_ms_per_seq=1.0, prefill_ms_per_token=0.08)
CHARS_PER_TOKEN = 4  # as the fleet's server counts
MEAN_OUTPUT = sum(WorkloadSpec().output_tokens) / len(WorkloadSpec().output_tokens)
BASE = {"kind": "vllm", "interval_ms": 50, "stale_after_ms": 500}  # bench_replicas.py's replica_metrics

Route = Callable[["Sim", str], int]


def server_text(conv: Conversation) -> str:
    """The prompt as the fleet's server hashes it (server.prompt_of)."""
    return "".join(f"<{m['role']}>{m['content']}" for m in conv.messages)


def gateway_text(conv: Conversation) -> str:
    """The prompt as the gateway's prefix index hashes it (extproc/replicas/prefix.prompt_text)."""
    system = conv.messages[0]["content"] if conv.messages[0]["role"] == "system" else ""
    rest = conv.messages[1:] if system else conv.messages
    return system + "".join(f"\x1e{m['role']}\x1f{m['content']}" for m in rest)


@dataclass
class Replica:
    name: str
    engine: Engine
    busy: bool = False  # a step is under way
    pending: Any = None  # that step's StepOut
    reading: ReplicaReading | None = None
    steps: int = 0
    batch_sum: float = 0.0
    kv_sum: float = 0.0
    last_end: float = 0.0


@dataclass
class Call:
    conv: Conversation
    max_tokens: int
    arrived: float
    replica: str
    ttft: float | None = None


@dataclass
class Sim:
    """One run: `route(sim, prompt_text) -> replica index` decides; the rest is the fleet."""

    rate: float
    duration: float
    seed: int
    route: Route
    spec: EngineSpec = FLEET
    n: int = 4
    interval_s: float = 0.05
    cap: int = 0  # a gateway-side queue: at most this many calls in flight per replica (0: none)
    pull: int = 0  # with cap: a replica with room takes the best-matching of the first `pull` held
    now: float = 0.0
    replicas: list[Replica] = field(default_factory=list)
    in_flight: dict[str, int] = field(default_factory=dict)
    at_scrape: dict[str, int] = field(default_factory=dict)  # in-flight when the last reading was taken
    work: dict[str, int] = field(default_factory=dict)  # in-flight output tokens asked (max_tokens)
    held: list[tuple[Conversation, int, float]] = field(default_factory=list)
    among: list[str] = field(default_factory=list)  # the replicas a call may go to now
    req: SimRequest | None = None  # the call being routed, as the replica will see it (oracle only)
    state: dict[str, Any] = field(default_factory=dict)  # the policy's own
    calls: dict[SimRequest, Call] = field(default_factory=dict)
    done: list[Call] = field(default_factory=list)
    tokens: int = 0
    window_tokens: int = 0  # made while arrivals last, past their first quarter
    last_end: float = 0.0

    def run(self) -> dict[str, Any]:
        self.replicas = [Replica(f"10.0.0.{i + 1}:8000", Engine(self.spec)) for i in range(self.n)]
        self._wl = Workload(WorkloadSpec(), self.seed)
        arrivals = random.Random(self.seed + 1)
        self._seq = itertools.count()
        self._events: list[tuple[float, int, str, int]] = []  # (time, tie, kind, replica)
        t = 0.0
        while t < self.duration:
            self._push(t, "arrive", -1)
            t += arrivals.expovariate(self.rate)
        phase = random.Random(self.seed + 2)
        for i in range(self.n):
            self._push(phase.random() * self.interval_s, "poll", i)
        arrivals_left = sum(1 for e in self._events if e[2] == "arrive")
        outstanding = 0
        while self._events:
            self.now, _, kind, i = heapq.heappop(self._events)
            if kind == "poll":
                r = self.replicas[i]
                e = r.engine
                r.reading = ReplicaReading(len(e.waiting), len(e.running), e.kv_usage, self.now)
                self.at_scrape[r.name] = self.in_flight.get(r.name, 0)
                if outstanding or arrivals_left:
                    self._push(self.now + self.interval_s, "poll", i)
            elif kind == "arrive":
                arrivals_left -= 1
                outstanding += 1
                conv, max_tokens = self._wl.next_call()
                self.held.append((conv, max_tokens, self.now))
                self._dispatch()
            else:
                outstanding -= self._step_ends(i)
                self._step(i)
                self._dispatch()
        return self.summary()

    def _push(self, t: float, kind: str, i: int) -> None:
        heapq.heappush(self._events, (t, next(self._seq), kind, i))

    def _step_ends(self, i: int) -> int:
        """Hand out the step's tokens; how many calls it finished."""
        r = self.replicas[i]
        out, r.pending, r.busy = r.pending, None, False
        if self.duration / 4 <= self.now < self.duration:
            self.window_tokens += len(out.tokens)
        for q in out.first:
            self.calls[q].ttft = self.now - self.calls[q].arrived
        for q in out.finished:
            c = self.calls.pop(q)
            self._wl.answered(c.conv, c.max_tokens)
            self.tokens += c.max_tokens
            self.done.append(c)
            self.in_flight[c.replica] -= 1
            self.work[c.replica] -= c.max_tokens
            self.last_end = r.last_end = self.now
        return len(out.finished)

    def _step(self, i: int) -> None:
        r = self.replicas[i]
        if r.busy or r.engine.idle:
            return
        out = r.engine.step()
        if out.duration_ms <= 0:
            return  # the queue's head waits for room: the next submit or finish steps again
        r.steps += 1
        r.batch_sum += len(r.engine.running)
        r.kv_sum += r.engine.kv_usage
        r.pending, r.busy = out, True
        self._push(self.now + out.duration_ms / 1000.0, "step", i)

    def _dispatch(self) -> None:
        """Held calls, oldest first, each to a replica under `cap` in-flight (no cap: at once)."""
        while self.held:
            self.among = [r.name for r in self.replicas if not self.cap or self.in_flight.get(r.name, 0) < self.cap]
            if not self.among:
                return
            k = 0
            if self.pull and len(self.among) == 1 and len(self.held) > 1 and "prefix" in self.state:
                index: PrefixIndex = self.state["prefix"]
                bc, pb = self.state["blocks"]
                depth = [index.match(block_hashes(gateway_text(c), bc, pb)).get(self.among[0], 0)
                         for c, _, _ in self.held[:self.pull]]
                k = max(range(len(depth)), key=lambda j: (depth[j], -j))
            conv, max_tokens, arrived = self.held.pop(k)
            text = server_text(conv)
            self.req = SimRequest(str(next(self._seq)), chain_hashes(text, self.spec.block_tokens * CHARS_PER_TOKEN),
                                  max(1, len(text) // CHARS_PER_TOKEN), max_tokens)
            i = self.route(self, gateway_text(conv))
            r = self.replicas[i]
            self.calls[self.req] = Call(conv, max_tokens, arrived, r.name)
            self.in_flight[r.name] = self.in_flight.get(r.name, 0) + 1
            self.work[r.name] = self.work.get(r.name, 0) + max_tokens
            r.engine.submit(self.req)
            self._step(i)

    def summary(self) -> dict[str, Any]:
        ttfts = sorted(c.ttft for c in self.done if c.ttft is not None)
        engines = [r.engine for r in self.replicas]
        queries = sum(e.prefix_queries for e in engines)
        per = {r.name: 0 for r in self.replicas}
        for c in self.done:
            per[c.replica] += 1
        steps = sum(r.steps for r in self.replicas) or 1
        return {"calls": len(self.done), "tokens": self.tokens, "wall_s": self.last_end,
                "tok_s": self.tokens / self.last_end if self.last_end else 0.0,
                "steady_tok_s": self.window_tokens / (0.75 * self.duration),
                "ttft_p50_ms": pct(ttfts, 50) * 1000, "ttft_p99_ms": pct(ttfts, 99) * 1000,
                "preemptions": sum(e.preemptions for e in engines),
                "hits": sum(e.prefix_hits for e in engines) / queries if queries else 0.0,
                "batch": sum(r.batch_sum for r in self.replicas) / steps,
                "kv": sum(r.kv_sum for r in self.replicas) / steps,
                "per_replica": list(per.values()), "idle_at": [round(r.last_end, 1) for r in self.replicas]}


# -- routing policies -------------------------------------------------------------------------------

def round_robin(sim: Sim, text: str) -> int:
    k = sim.state.get("rr", 0)
    sim.state["rr"] = k + 1
    names = [r.name for r in sim.replicas]
    return names.index(sim.among[k % len(sim.among)])


def least_request(sim: Sim, text: str) -> int:
    """Envoy's least_request: the fewer in-flight of two chosen at random (P2C)."""
    rng = sim.state.setdefault("rng", random.Random(sim.seed + 3))
    names = [r.name for r in sim.replicas]
    if len(sim.among) == 1:
        return names.index(sim.among[0])
    a, b = rng.sample(sim.among, 2)
    return names.index(a if sim.in_flight.get(a, 0) <= sim.in_flight.get(b, 0) else b)


def picker(settings: ReplicaMetrics, load: str = "") -> Route:
    """The gateway's picker (ReplicaBoard.pick, then .sent) on scraped readings and live in-flight;
    `load` swaps what it counts as a replica's queue (the module's docstring)."""
    def route(sim: Sim, text: str) -> int:
        index = sim.state.get("prefix")
        if index is None:
            index = sim.state["prefix"] = PrefixIndex(settings.prefix_entries, settings.prefix_ways)
            sim.state["blocks"] = (settings.block_chars, settings.prefix_blocks)
        names = [r.name for r in sim.replicas]
        readings = {r.name: r.reading for r in sim.replicas if r.reading is not None}
        in_flight: dict[str, float] = dict(sim.in_flight)
        if load in ("inflight", "work"):
            readings = {k: ReplicaReading(0, 0, v.kv_usage, v.at) for k, v in readings.items()}
            if load == "work":
                in_flight = {k: v / MEAN_OUTPUT for k, v in sim.work.items()}
        elif load == "delta":
            in_flight = {k: max(-readings[k].queue, v - sim.at_scrape.get(k, 0)) for k, v in sim.in_flight.items()
                         if k in readings}
        hashes = block_hashes(text, settings.block_chars, settings.prefix_blocks) if settings.prefix_blocks else []
        p = pick_replica(settings, sim.among, readings, in_flight, {}, sim.now,  # type: ignore[arg-type]
                         prefix_depth=index.match(hashes) if hashes else None, prefix_blocks=len(hashes),
                         prefix_key=hashes[0] if hashes else b"")
        i = names.index(p.endpoint) if p.endpoint is not None else round_robin(sim, text)
        if hashes:
            index.record(hashes, names[i])
        return i
    return route


def oracle(eps: float, floor: float = 8.0) -> Route:
    """A ceiling, not a router: the replicas' true caches and queues (no scrape lag, no guessing from
    what was sent where); the most cached leading blocks among the replicas within the bounded load,
    the shortest queue on a tie."""
    def route(sim: Sim, text: str) -> int:
        req = sim.req
        assert req is not None
        loads = {r.name: len(r.engine.waiting) + len(r.engine.running) for r in sim.replicas if r.name in sim.among}
        bound = load_bound(loads, eps, floor)

        def cached(r: Replica) -> int:
            n = 0
            for h in req.block_hashes:
                if h not in r.engine._block_of:
                    break
                n += 1
            return n
        ok = [i for i, r in enumerate(sim.replicas) if r.name in loads and loads[r.name] + 1 <= bound] or \
            [i for i, r in enumerate(sim.replicas) if r.name in loads]
        return max(ok, key=lambda i: (cached(sim.replicas[i]), -loads[sim.replicas[i].name]))
    return route


def cache_aware(cache_threshold: float = 0.3, abs_threshold: float = 64, rel_threshold: float = 1.5,
                block_chars: int = 64) -> Route:
    """sglang-router's `cache_aware` (its defaults), approximated: past an imbalance of its own
    in-flight counts (max - min > 64 and max > 1.5 min) the least loaded; else the replica whose
    tree of prompts sent matches the most of this one, if over 30% of it, else the smallest tree.
    Its radix tree over characters is approximated by chained blocks of `block_chars`."""
    def route(sim: Sim, text: str) -> int:
        trees: dict[str, set[bytes]] = sim.state.setdefault("trees", {r.name: set() for r in sim.replicas})
        names = [r.name for r in sim.replicas]
        loads = {n: sim.in_flight.get(n, 0) for n in sim.among}
        hashes = block_hashes(text, block_chars, 1 << 16)
        hi, lo = max(loads.values()), min(loads.values())
        if hi - lo > abs_threshold and hi > lo * rel_threshold:
            pick = min(sim.among, key=lambda n: (loads[n], names.index(n)))
        else:
            def matched(n: str) -> int:
                k = 0
                for h in hashes:
                    if h not in trees[n]:
                        break
                    k += 1
                return k
            best = max(sim.among, key=lambda n: (matched(n), -names.index(n)))
            share = matched(best) * block_chars / max(1, len(text))
            pick = best if share > cache_threshold else min(sim.among, key=lambda n: (len(trees[n]), names.index(n)))
        trees[pick].update(hashes)
        return names.index(pick)
    return route


@dataclass(frozen=True)
class Policy:
    route: Callable[[], Route]  # a fresh one per run (pickers keep a prefix index)
    cap: int = 0
    pull: int = 0


def _const(route: Route) -> Callable[[], Route]:
    return lambda: route


def _picker(settings: ReplicaMetrics, load: str = "") -> Callable[[], Route]:
    return lambda: picker(settings, load)


def _oracle(eps: float) -> Callable[[], Route]:
    return lambda: oracle(eps)


def policies(names: str, variants: str) -> dict[str, Policy]:
    out: dict[str, Policy] = {}
    for name in names.split(","):
        if name in ("round_robin", "least_request"):
            out[name] = Policy(_const(round_robin if name == "round_robin" else least_request))
        elif name == "cache_aware":
            out[name] = Policy(cache_aware)
        elif name == "picker":
            out[name] = Policy(_picker(ReplicaMetrics.model_validate(BASE)))
        else:
            raise SystemExit(f"unknown policy {name!r}")
    for k, v in (x.split("=", 1) for x in variants.split(";") if x):
        over = json.loads(v)
        if "_oracle" in over:
            out[f"oracle:{k}"] = Policy(_oracle(float(over["_oracle"])))
            continue
        cap, pull, load = int(over.pop("_cap", 0)), int(over.pop("_pull", 0)), str(over.pop("_load", ""))
        out[f"picker:{k}"] = Policy(_picker(ReplicaMetrics.model_validate({**BASE, **over}), load), cap, pull)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rates", default=scaled("8,12,16,20,24,32", "8"), help="arrivals per second, comma-separated")
    ap.add_argument("--duration", type=float, default=scaled(20.0, 3.0), help="seconds of arrivals")
    ap.add_argument("--seeds", default=scaled("0,1,2,3,4", "0"), help="one workload each; medians over them")
    ap.add_argument("--policies", default="round_robin,least_request,picker",
                    help="of round_robin, least_request, picker, cache_aware (sglang-router's, approximated)")
    ap.add_argument("--variants", default="", help="'NAME=JSON;...': replica_metrics keys and the experiments "
                    "in the module's docstring")
    ap.add_argument("--fleet", default="", help="EngineSpec fields over bench_replicas.py's fleet, as JSON "
                    "(a what-if, e.g. '{\"decode_base_ms\": 8, \"decode_ms_per_seq\": 0.3}')")
    ap.add_argument("--json", default="", help="write every run's figures here")
    a = ap.parse_args(argv)
    spec = dataclasses.replace(FLEET, **json.loads(a.fleet)) if a.fleet else FLEET
    chosen = policies(a.policies, a.variants)
    seeds = [int(s) for s in a.seeds.split(",")]
    runs_by: dict[str, list[dict[str, Any]]] = {}
    rows: list[dict[str, Any]] = []
    print(f"{'rate/s':>6} {'policy':<20}{'tok/s':>7}{'x rr':>6}{'steady':>7}{'x rr':>6}{'p50 ms':>8}{'p99 ms':>8}"
          f"{'preempt':>8}{'hits':>6}{'batch':>6}{'kv':>5}  tok/s by seed; first seed: calls per replica, idle at s")
    for rate in [float(r) for r in a.rates.split(",")]:
        base: tuple[float, float] | None = None
        for name, pol in chosen.items():
            runs = [Sim(rate, a.duration, 1000 * s + int(rate * 10), pol.route(), spec, cap=pol.cap,
                        pull=pol.pull).run() for s in seeds]
            runs_by[f"{name}@{rate:g}"] = runs

            def med(k: str, runs: list[dict[str, Any]] = runs) -> float:
                return float(statistics.median(r[k] for r in runs))
            tps, sty = med("tok_s"), med("steady_tok_s")
            if name == "round_robin":
                base = (tps, sty)
            xt, xs = (tps / base[0], sty / base[1]) if base else (float("nan"), float("nan"))
            print(f"{rate:>6g} {name:<20}{tps:>7.0f}{xt:>6.2f}{sty:>7.0f}{xs:>6.2f}{med('ttft_p50_ms'):>8.0f}"
                  f"{med('ttft_p99_ms'):>8.0f}{med('preemptions'):>8.0f}{med('hits'):>6.2f}{med('batch'):>6.1f}"
                  f"{med('kv'):>5.2f}  {' '.join(str(round(r['tok_s'])) for r in runs)}; "
                  f"{runs[0]['per_replica']} {runs[0]['idle_at']}", flush=True)
            case = f"{name}@{rate:g}"
            rows += [
                {"bench": "fleet", "case": case, "metric": "output_tok_s", "value": round(tps, 1), "unit": "tok/s",
                 **({"ratio": round(xt, 3)} if base else {})},
                {"bench": "fleet", "case": case, "metric": "steady_tok_s", "value": round(sty, 1), "unit": "tok/s",
                 **({"ratio": round(xs, 3)} if base else {})},
                {"bench": "fleet", "case": case, "metric": "ttft_p99", "value": round(med("ttft_p99_ms"), 1),
                 "unit": "ms"},
                {"bench": "fleet", "case": case, "metric": "preemptions", "value": med("preemptions"),
                 "unit": "count"},
            ]
    if a.json:
        Path(a.json).write_text(json.dumps(runs_by, indent=1))
    if SMOKE:
        print("(smoke mode: the figures mean nothing)")
    print("SUMMARY " + json.dumps(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
