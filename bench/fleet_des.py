"""The replica benchmark's fleet and workload in simulated time: no sockets, no event loop, no box.

    .venv/bin/python bench/fleet_des.py [--rates 8,12,16,20,24,32] [--duration 20] [--seeds 0,1,2]
        [--policies round_robin,least_request,picker,...] [--variants 'NAME=JSON;...']

The same engines as the live fleet (devstack/fleet/engine.py, bench_replicas.py's FLEET_ARGS), the
same workload (bench/fleet_load.py's `Workload`, Poisson arrivals, conversations that continue when
their answer is in), and the picker's own code (`pick_replica`, `PrefixIndex`) fed readings that are
scraped every `interval_ms` (each replica at its own phase) while the in-flight count moves at once,
as the gateway sees them. A run is a few seconds of CPU and the same seed gives the same result to
the token, so a ratio between routing policies here is the policies' own, with none of the box's
noise (bench_replicas.py's `late_s`); the live bench then checks what this finds through Envoy.
Reported per policy and rate: output tokens/s (tokens over the first arrival to the last finish, as
bench_replicas.py), TTFT p50/p99 at the replicas, preemptions, prefix-hit share, calls per replica,
and the mean running batch and KV use over busy steps.
"""

from __future__ import annotations

import argparse
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
from bench.smoke import scaled  # noqa: E402
from contracts.config.balancing import ReplicaMetrics  # noqa: E402
from devstack.fleet.engine import Engine, EngineSpec, SimRequest, chain_hashes  # noqa: E402
from extproc.replicas.picker import pick_replica  # noqa: E402
from extproc.replicas.prefix import PrefixIndex, block_hashes  # noqa: E402
from extproc.replicas.readings import ReplicaReading  # noqa: E402

# bench_replicas.py's FLEET_ARGS, as an EngineSpec.
FLEET = EngineSpec(kv_blocks=1536, block_tokens=16, max_running=48, prefill_budget=2048, decode_base_ms=20.0,
                   decode_ms_per_seq=1.0, prefill_ms_per_token=0.08)
CHARS_PER_TOKEN = 4


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
    busy_until: float | None = None  # the end of the step in progress
    pending: Any = None  # that step's StepOut
    reading: ReplicaReading | None = None
    steps: int = 0
    batch_sum: float = 0.0
    kv_sum: float = 0.0
    busy_s: float = 0.0
    last_end: float = 0.0


@dataclass
class Call:
    conv: Conversation
    max_tokens: int
    sent: float
    replica: str
    ttft: float | None = None


@dataclass
class Sim:
    """One run: `route(sim, call_text, conv) -> replica index` decides; everything else is the fleet."""

    rate: float
    duration: float
    seed: int
    route: Callable[[Sim, str], int]
    interval_s: float = 0.05
    spec: EngineSpec = FLEET
    n: int = 4
    now: float = 0.0
    replicas: list[Replica] = field(default_factory=list)
    in_flight: dict[str, int] = field(default_factory=dict)
    at_scrape: dict[str, int] = field(default_factory=dict)  # in-flight when the last reading was taken
    work: dict[str, int] = field(default_factory=dict)  # in-flight output tokens asked (max_tokens)
    cap: int = 0  # a gateway-side queue: at most this many calls in flight per replica (0: none)
    held: list[tuple[Conversation, int, float]] = field(default_factory=list)
    calls: dict[SimRequest, Call] = field(default_factory=dict)
    done: list[Call] = field(default_factory=list)
    tokens: int = 0
    window_tokens: int = 0  # generated while arrivals last, after the first quarter (steady state)
    last_end: float = 0.0
    state: dict[str, Any] = field(default_factory=dict)  # the policy's own

    def run(self) -> dict[str, Any]:
        self.replicas = [Replica(f"10.0.0.{i + 1}:8000", Engine(self.spec)) for i in range(self.n)]
        wl = Workload(WorkloadSpec(), self.seed)
        arrivals = random.Random(self.seed + 1)
        seq = itertools.count()
        events: list[tuple[float, int, str, int]] = []  # (time, tie, kind, replica index or -1)
        t = 0.0
        while t < self.duration:
            heapq.heappush(events, (t, next(seq), "arrive", -1))
            t += arrivals.expovariate(self.rate)
        phase = random.Random(self.seed + 2)
        for i in range(self.n):
            heapq.heappush(events, (phase.random() * self.interval_s, next(seq), "poll", i))
        outstanding = 0
        arrivals_left = sum(1 for e in events if e[2] == "arrive")
        while events:
            self.now, _, kind, i = heapq.heappop(events)
            if kind == "poll":
                r = self.replicas[i]
                e = r.engine
                r.reading = ReplicaReading(len(e.waiting), len(e.running), e.kv_usage, self.now)
                self.at_scrape[r.name] = self.in_flight.get(r.name, 0)
                if outstanding or arrivals_left:
                    heapq.heappush(events, (self.now + self.interval_s, next(seq), "poll", i))
            elif kind == "arrive":
                arrivals_left -= 1
                conv, max_tokens = wl.next_call()
                outstanding += 1
                self.held.append((conv, max_tokens, self.now))
                self._dispatch(events, seq)
            else:  # a step ends
                r = self.replicas[i]
                out, r.pending, r.busy_until = r.pending, None, None
                if self.duration / 4 <= self.now < self.duration:
                    self.window_tokens += len(out.tokens)
                for q in out.first:
                    self.calls[q].ttft = self.now - self.calls[q].sent
                for q in out.finished:
                    c = self.calls.pop(q)
                    wl.answered(c.conv, c.max_tokens)
                    self.tokens += c.max_tokens
                    self.done.append(c)
                    self.in_flight[c.replica] -= 1
                    self.work[c.replica] -= c.max_tokens
                    self.finished(c)
                    outstanding -= 1
                    self.last_end = r.last_end = self.now
                self._step(i, events, seq)
                self._dispatch(events, seq)
        return self.summary()

    def _dispatch(self, events: list[tuple[float, int, str, int]], seq: itertools.count[int]) -> None:
        """Held calls, oldest first, to a replica under `cap` in-flight (cap 0: at once, anywhere)."""
        while self.held:
            under = [r.name for r in self.replicas if not self.cap or self.in_flight.get(r.name, 0) < self.cap]
            if not under:
                return
            k = 0
            pull = self.state.get("pull", 0)
            if pull and len(under) == 1 and len(self.held) > 1 and "prefix" in self.state:
                # One replica has room and calls wait: it takes the waiting call its cache serves best.
                st = self.state["prefix"]
                bc, pb = self.state["block"]
                depths = [st.match(block_hashes(gateway_text(c), bc, pb)).get(under[0], 0)
                          for c, _, _ in self.held[:pull]]
                k = max(range(len(depths)), key=lambda j: (depths[j], -j))
            conv, max_tokens, arrived = self.held.pop(k)
            text = server_text(conv)
            bt = self.spec.block_tokens
            req = SimRequest(str(next(seq)), chain_hashes(text, bt * CHARS_PER_TOKEN),
                             max(1, len(text) // CHARS_PER_TOKEN), max_tokens)
            self.state["req"] = req  # what an oracle policy may peek at
            self.state["among"] = under
            i = self.route(self, gateway_text(conv))
            r = self.replicas[i]
            self.calls[req] = Call(conv, max_tokens, arrived, r.name)
            self.in_flight[r.name] = self.in_flight.get(r.name, 0) + 1
            self.work[r.name] = self.work.get(r.name, 0) + max_tokens
            r.engine.submit(req)
            if r.busy_until is None:
                self._step(i, events, seq)

    def finished(self, call: Call) -> None:
        hook = self.state.get("on_done")
        if hook:
            hook(self, call)

    def _step(self, i: int, events: list[tuple[float, int, str, int]], seq: itertools.count[int]) -> None:
        r = self.replicas[i]
        if r.engine.idle:
            return
        out = r.engine.step()
        if out.duration_ms <= 0:
            return  # the queue's head waits for room: the next submit steps again
        r.steps += 1
        r.batch_sum += len(r.engine.running)
        r.kv_sum += r.engine.kv_usage
        r.pending, r.busy_until = out, self.now + out.duration_ms / 1000.0
        r.busy_s += out.duration_ms / 1000.0
        heapq.heappush(events, (r.busy_until, next(seq), "step", i))

    def summary(self) -> dict[str, Any]:
        ttfts = sorted(c.ttft for c in self.done if c.ttft is not None)
        e = [r.engine for r in self.replicas]
        q = sum(x.prefix_queries for x in e)
        per = {r.name: 0 for r in self.replicas}
        for c in self.done:
            per[c.replica] += 1
        steps = sum(r.steps for r in self.replicas) or 1
        return {"tok_s": self.tokens / self.last_end, "steady_tok_s": self.window_tokens / (0.75 * self.duration), "wall_s": self.last_end, "calls": len(self.done),
                "ttft_p50_ms": pct(ttfts, 50) * 1000, "ttft_p99_ms": pct(ttfts, 99) * 1000,
                "preemptions": sum(x.preemptions for x in e),
                "hits": sum(x.prefix_hits for x in e) / q if q else 0.0,
                "per_replica": list(per.values()),
                "batch": sum(r.batch_sum for r in self.replicas) / steps,
                "kv": sum(r.kv_sum for r in self.replicas) / steps,
                "ends": [round(r.last_end, 1) for r in self.replicas],
                "busy": [round(r.busy_s, 1) for r in self.replicas]}


# -- routing policies -------------------------------------------------------------------------------

def round_robin(sim: Sim, text: str) -> int:
    k = sim.state.get("rr", 0)
    sim.state["rr"] = k + 1
    return k % sim.n


def least_request(sim: Sim, text: str) -> int:
    """Envoy's least_request: the fewer in-flight of two chosen at random (P2C)."""
    rng = sim.state.setdefault("rng", random.Random(sim.seed + 3))
    a, b = rng.sample(range(sim.n), 2)
    fa, fb = sim.in_flight.get(sim.replicas[a].name, 0), sim.in_flight.get(sim.replicas[b].name, 0)
    return a if fa <= fb else b


def oracle(eps: float, floor: float = 8.0) -> Callable[[Sim, str], int]:
    """A ceiling, not a router: the replicas' true caches and queues, no lag; the most cached blocks
    among the replicas within the bounded load (bounded.py's bound), the shortest queue on a tie."""
    def route(sim: Sim, text: str) -> int:
        req: SimRequest = sim.state["req"]
        loads = [len(r.engine.waiting) + len(r.engine.running) for r in sim.replicas]
        bound = max(floor, -(-(1 + eps) * (sum(loads) + 1) // sim.n))

        def cached(r: Replica) -> int:
            n = 0
            for h in req.block_hashes:
                if h not in r.engine._block_of:
                    break
                n += 1
            return n
        ok = [i for i in range(sim.n) if loads[i] + 1 <= bound] or list(range(sim.n))
        return max(ok, key=lambda i: (cached(sim.replicas[i]), -loads[i]))
    return route


def picker(settings: ReplicaMetrics, load: str = "scrape+inflight") -> Callable[[Sim, str], int]:
    """The gateway's picker: board.pick then board.sent, on scraped readings and live in-flight.
    `load` (experiments): what the queue counts; `inflight` the gateway's own count alone, `work` its
    in-flight output tokens in mean calls, `delta` the scrape plus what was sent since."""
    def route(sim: Sim, text: str) -> int:
        index = sim.state.get("prefix")
        if index is None:
            index = sim.state["prefix"] = PrefixIndex(settings.prefix_entries, settings.prefix_ways)
            sim.state["block"] = (settings.block_chars, settings.prefix_blocks)
        names = [r.name for r in sim.replicas]
        among = sim.state.get("among") or names
        readings = {r.name: r.reading for r in sim.replicas if r.reading is not None}
        in_flight: dict[str, float] = dict(sim.in_flight)
        if load in ("inflight", "work"):
            readings = {k: ReplicaReading(0, 0, v.kv_usage, v.at) for k, v in readings.items()}
            if load == "work":
                in_flight = {k: v / 117.0 for k, v in sim.work.items()}
        elif load == "delta":
            at = sim.at_scrape
            in_flight = {k: max(-readings[k].queue, v - at.get(k, 0)) for k, v in sim.in_flight.items()
                         if k in readings}
        hashes = block_hashes(text, settings.block_chars, settings.prefix_blocks) if settings.prefix_blocks else []
        p = pick_replica(settings, among, readings, in_flight, {}, sim.now,  # type: ignore[arg-type]
                         prefix_depth=index.match(hashes) if hashes else None, prefix_blocks=len(hashes),
                         prefix_key=hashes[0] if hashes else b"")
        i = names.index(p.endpoint) if p.endpoint is not None else names.index(among[round_robin(sim, text) % len(among)])
        if hashes:
            index.record(hashes, names[i])
        return i
    return route


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rates", default=scaled("8,12,16,20,24,32", "8"))
    ap.add_argument("--duration", type=float, default=scaled(20.0, 3.0))
    ap.add_argument("--seeds", default=scaled("0,1,2", "0"), help="one workload per seed; medians over them")
    ap.add_argument("--policies", default="round_robin,least_request,picker")
    ap.add_argument("--variants", default="", help="picker variants: 'NAME=JSON;...' of replica_metrics keys")
    ap.add_argument("--json", default="")
    a = ap.parse_args(argv)
    base = {"kind": "vllm", "interval_ms": 50, "stale_after_ms": 500}
    policies: dict[str, Callable[[Sim, str], int]] = {}
    caps: dict[str, int] = {}
    pulls: dict[str, int] = {}
    for name in a.policies.split(","):
        policies[name] = {"round_robin": round_robin, "least_request": least_request}.get(name) or picker(
            ReplicaMetrics(**base))
    for k, v in (x.split("=", 1) for x in a.variants.split(";") if x):
        over = json.loads(v)
        if "_cap" in over:
            caps[f"picker:{k}"] = over.pop("_cap")
        if "_pull" in over:
            pulls[f"picker:{k}"] = over.pop("_pull")
        if "_oracle" in over:
            policies[f"oracle:{k}"] = oracle(over["_oracle"])
            continue
        load = over.pop("_load", "scrape+inflight")
        policies[f"picker:{k}"] = picker(ReplicaMetrics(**{**base, **over}), load)
    seeds = [int(s) for s in a.seeds.split(",")]
    out: dict[str, Any] = {}
    print(f"{'rate/s':>6} {'policy':<22}{'tok/s':>7}{'x rr':>6}{'p50 ms':>8}{'p99 ms':>8}{'preempt':>8}{'hits':>6}"
          f"{'batch':>7}{'kv':>6}{'steady':>7}{'x rr':>6}  tok/s by seed; calls per replica (first seed)")
    for rate in [float(r) for r in a.rates.split(",")]:
        rr_tps = None
        for name, route in policies.items():
            runs = [Sim(rate, a.duration, 1000 * s + int(rate * 10), route, cap=caps.get(name, 0),
                        state={"pull": pulls.get(name, 0)}).run() for s in seeds]
            out[f"{name}@{rate:g}"] = runs

            def med(k: str, runs: list[dict[str, Any]] = runs) -> float:
                return statistics.median(r[k] for r in runs)
            tps, sty = med("tok_s"), med("steady_tok_s")
            if name == "round_robin":
                rr_tps, rr_sty = tps, sty
            x = f"{tps / rr_tps:6.2f}" if rr_tps else "     -"
            xs = f"{sty / rr_sty:6.2f}" if rr_tps else "     -"
            print(f"{rate:>6g} {name:<22}{tps:>7.0f}{x}{med('ttft_p50_ms'):>8.0f}{med('ttft_p99_ms'):>8.0f}"
                  f"{med('preemptions'):>8.0f}{med('hits'):>6.2f}{med('batch'):>7.1f}{med('kv'):>6.2f}{sty:>7.0f}{xs}  "
                  f"{' '.join(str(round(r['tok_s'])) for r in runs)}; {runs[0]['per_replica']} ends {runs[0]['ends']}", flush=True)
    if a.json:
        Path(a.json).write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
