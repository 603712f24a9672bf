"""Gateway overhead: the same demo upstream through bare Envoy and through Modelyard, in one run.

Load comes from wrk (Debian's package) at 1 and 16 connections; each case runs `--rounds` times
and the median round is reported, with Modelyard's ratio to bare Envoy. Every response's status
is counted (bench.wrk_load): req/s counts 200s only, and any other status or socket error, in any
round or warm-up, fails the bench with a `FAILED:` line and exit status 1.

CPU per request (`extproc_cpu_us`, `envoy_cpu_us`): each process's CPU-time delta (/proc, user +
system) over a c=16 round divided by that round's 200s, median of the rounds, for three stacks run
interleaved in the same rounds: `minimal` (one tenant, one OpenAI deployment, nothing else),
`demo` (the shipped modelyard.yaml on free ports: auth, scheduler with watermarks, rate limits,
metering, audit, A/B) and `floor`: the minimal stack's Envoy config with a do-nothing grpc.aio
ext_proc (bench/floor_extproc.py) in Modelyard's place, chat bodies in full duplex as shipped. The floor
is what the ext_proc round trips cost before any gateway logic; Modelyard's CPU rows carry their ratio to it, and
`added_p50_ms` is Modelyard's (and the floor's) p50 at one connection less bare Envoy's.

The CPU rounds run two shapes: `unary` (the call above) and `stream` (a ~100-chunk SSE stream; the
floor answers it chunk by chunk as Modelyard does). Per shape and stack they report CPU per request
(Envoy + extproc), Modelyard's share above the floor (`above_floor_us`, and as a fraction of its
own CPU) and the ext_proc messages per request (`extproc_msgs`: Envoy's
`http.modelyard.ext_proc.stream_msgs_sent` over `streams_started`, from its admin), and the replies
each request waits on in turn (`sequential_waits`, from the processing mode in Envoy's config dump).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import statistics
import sys
from pathlib import Path

import httpx
import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench import scratch  # noqa: E402
from bench.outcomes import Tally, report  # noqa: E402
from bench.proc_cpu import cpu_seconds  # noqa: E402
from bench.smoke import SMOKE, scaled  # noqa: E402
from bench.wrk_load import WrkResult, post_script, run_wrk  # noqa: E402
from contracts.config import parse_config  # noqa: E402
from contracts.workers import default_workers  # noqa: E402
from controlplane.bootstrap import bootstrap_dict, build_bootstrap  # noqa: E402
from controlplane.environments import EnvironmentConfig  # noqa: E402
from devstack.launcher import Child, Stack, envoy_binary  # noqa: E402
from tests.conftest import UPSTREAM_KEYS  # noqa: E402
from tests.stack_config import demo_config_free_ports, free_port, free_ports_run, start_stack  # noqa: E402

BODY = '{"model":"demo-gpt","messages":[{"role":"user","content":"hello from the benchmark"}]}'
# The demo upstream streams one event per word of its echo: 97 words in, about 100 chunks out.
STREAM_BODY = json.dumps({"model": "demo-gpt", "stream": True, "messages": [
    {"role": "user", "content": " ".join(["hello from the streaming benchmark"] * 24 + ["now"])}]},
    separators=(",", ":"))
EXTPROC_STATS = "http.modelyard.ext_proc."
HEADERS = {"Content-Type": "application/json", "Authorization": "Bearer sk-modelyard-demo"}


def _config(workers: int = 1) -> dict:
    up = free_port()
    return {
        "listener": {"address": "127.0.0.1", "port": free_port()},
        "extproc": {"address": f"127.0.0.1:{free_ports_run(workers)}",
                    "metrics_address": f"127.0.0.1:{free_ports_run(workers)}", "workers": workers,
                    "bodies": "duplex"},  # the shipped config's design: the floor's too
        "models": [{"name": "demo-gpt", "deployments": [
            {"cluster": "demo-openai", "protocol": "openai", "endpoints": [f"127.0.0.1:{up}"]}]}],
        "tenants": [{"name": "bench", "tier": "L1", "api_keys": [
            "sha256:c898d9f492d2577070136e9b8f2852e4f208ee9f1f4a5dff1385dcea7966f81e"]}],
        "devstack": {"demo_upstreams": ["demo-openai"]},
    }


def _bare_envoy(cfg_obj, env: EnvironmentConfig, port: int) -> dict:
    """Modelyard's own bootstrap minus ext_proc, routed straight to the demo cluster."""
    boot = bootstrap_dict(build_bootstrap(cfg_obj, env))
    listener = boot["static_resources"]["listeners"][0]
    listener["address"]["socket_address"]["port_value"] = port
    hcm = listener["filter_chains"][0]["filters"][0]["typed_config"]
    hcm["http_filters"] = [f for f in hcm["http_filters"] if f["name"] != "envoy.filters.http.ext_proc"]
    route = hcm["route_config"]["virtual_hosts"][0]["routes"][0]
    route["match"] = {"prefix": "/"}
    route["route"].pop("cluster_header")
    route["route"]["cluster"] = "demo-openai"
    boot.pop("admin", None)
    return boot


def _floor_stack(workdir: Path, env: EnvironmentConfig, socket_server: str | None = None,
                 bodies: str = "duplex") -> Stack:
    """The minimal config's Envoy and upstream with bench/floor_extproc.py as its ext_proc; with
    `socket_server` (h2 or grpcio) Envoy reaches it over a Unix socket that one serves; `bodies` as
    `extproc.bodies` (the floor answers either design)."""
    workdir.mkdir(parents=True)
    data = _config()
    data["extproc"]["bodies"] = bodies
    if socket_server:
        data["extproc"]["unix_socket"] = str(workdir / "extproc.sock")
    (workdir / "modelyard.yaml").write_text(yaml.safe_dump(data))
    cfg = parse_config(data)
    s = Stack(cfg, env, config_path=workdir / "modelyard.yaml", workdir=workdir, quiet=True)
    s.child("extproc").argv = [sys.executable, str(ROOT / "bench" / "floor_extproc.py"), cfg.extproc.address,
                               "demo-openai", "--loop", cfg.extproc.event_loop]
    if socket_server:
        s.child("extproc").argv += ["--socket", str(workdir / "extproc.sock"), "--server", socket_server]
    # The floor answers only the routed request, not Envoy's readiness path: wait for the listener.
    s.child("envoy").ready = ("tcp", s.url.removeprefix("http://"))
    return s


def only_demo_gpt_upstreams(stack: Stack, data: dict) -> None:
    """The shipped config as it is, with only demo-gpt's demo upstreams (and the agents) started."""
    keep = {d["cluster"] for m in data["models"] if m["name"] == "demo-gpt" for d in m["deployments"]}
    stack.children = [c for c in stack.children if not c.name.startswith("demo-") or c.name.partition("@")[0] in keep]


def _pid(stack: Stack, child: str) -> int:
    proc = stack.child(child).proc
    assert proc is not None  # started with the stack
    return proc.pid




def processing_mode(stack: Stack) -> dict[str, str]:
    """The ext_proc filter's processing mode for the bench's chat call as the running Envoy holds it (its
    config dump: a chat route's per-route override where there is one, else the filter's; an omitted
    field is the proto's default)."""
    dump = httpx.get(f"{stack.admin_url()}/config_dump", timeout=5).json()
    found: list[dict[str, str]] = []

    def walk(node: object) -> None:
        if isinstance(node, dict):
            kind = str(node.get("@type", ""))
            if kind.endswith("ext_proc.v3.ExtProcPerRoute"):  # the chat paths' own (extproc.bodies: duplex)
                found.insert(0, node.get("overrides", {}).get("processing_mode", {}))
            elif kind.endswith("ext_proc.v3.ExternalProcessor"):
                found.append(node.get("processing_mode", {}))
            for v in node.values():
                walk(v)
        elif isinstance(node, list):
            for v in node:
                walk(v)

    walk(dump)
    mode = found[0] if found else {}
    return {"request_header_mode": mode.get("request_header_mode", "SEND"),
            "request_body_mode": mode.get("request_body_mode", "NONE"),
            "response_header_mode": mode.get("response_header_mode", "SEND"),
            "response_body_mode": mode.get("response_body_mode", "NONE")}


def sequential_waits(mode: dict[str, str]) -> int:
    """ext_proc replies a request waits on in turn: a sent headers message and a sent body each one,
    a full-duplex body's headers and body one together. An SSE answer's BUFFERED body is switched to
    STREAMED, still one: its chunks' replies overlap, the last one holds the end back."""
    waits = 0
    for side in ("request", "response"):
        body = mode[f"{side}_body_mode"]
        if body == "FULL_DUPLEX_STREAMED":
            waits += 1
            continue
        waits += (mode[f"{side}_header_mode"] != "SKIP") + (body != "NONE")
    return waits


def extproc_stats(stack: Stack) -> dict[str, int]:
    """The main listener's ext_proc counters (streams_started, stream_msgs_sent, ...) from Envoy's admin."""
    text = httpx.get(f"{stack.admin_url()}/stats", params={"filter": "^" + EXTPROC_STATS.replace(".", r"\.")},
                     timeout=5).text
    out: dict[str, int] = {}
    for line in text.splitlines():
        name, _, value = line.partition(": ")
        if name.startswith(EXTPROC_STATS) and value.strip().isdigit():
            out[name.removeprefix(EXTPROC_STATS)] = int(value)
    return out


def peak_rss_mb(pid: int) -> float:
    """VmHWM: the process's peak resident set, from /proc."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=scaled(4.0, 1.0))
    parser.add_argument("--rounds", type=int, default=scaled(3, 1))
    a = parser.parse_args(argv)
    if not shutil.which("wrk"):
        print("bench_gateway: wrk is not installed (apt-get install wrk); skipped")
        print("SUMMARY []")
        return 0
    work = scratch.folder("bench-gw-")
    data = _config()
    cfg_path = work / "modelyard.yaml"
    cfg_path.write_text(yaml.safe_dump(data))
    cfg = parse_config(data)
    # Envoy's admin on a free port: the ext_proc message counters come from its stats.
    env = EnvironmentConfig(name="bench", admin={"address": "127.0.0.1", "port": 0}, concurrency=1)
    bare_port = free_port()
    (work / "bare.yaml").write_text(yaml.safe_dump(_bare_envoy(cfg, env, bare_port)))
    script = work / "post.lua"
    script.write_text(post_script(BODY, HEADERS))
    shape_scripts = {"unary": script, "stream": work / "stream.lua"}
    shape_scripts["stream"].write_text(post_script(STREAM_BODY, HEADERS))
    stack = Stack(cfg, env, config_path=cfg_path, workdir=work, quiet=True)
    floor_stack = _floor_stack(work / "floor", env)
    stack.children.append(Child("bare-envoy", [envoy_binary(), "-c", str(work / "bare.yaml"), "--concurrency", "1",
                                               "--disable-hot-restart", "--log-level", "error"],
                                ("tcp", f"127.0.0.1:{bare_port}")))
    for name, value in UPSTREAM_KEYS.items():
        os.environ.setdefault(name, value)
    demo_data, _ = demo_config_free_ports()
    (work / "demo").mkdir()
    demo_stack = start_stack(work / "demo", demo_data)
    demo_stack.quiet = True
    if SMOKE:  # nothing but demo-gpt is called
        only_demo_gpt_upstreams(demo_stack, demo_data)
    # The minimal config again with 2 and the default number of workers (1 is `stack` itself).
    worker_stacks: dict[int, Stack] = {}
    for n in sorted({2, scaled(default_workers(), 2)} - {1}):
        wdata = _config(n)
        (work / f"workers-{n}").mkdir()
        (work / f"workers-{n}" / "modelyard.yaml").write_text(yaml.safe_dump(wdata))
        worker_stacks[n] = Stack(parse_config(wdata), env, config_path=work / f"workers-{n}" / "modelyard.yaml",
                                 workdir=work / f"workers-{n}", quiet=True)
    rows = []
    tallies: list[Tally] = []

    def load(name: str, url: str, conns: int, seconds: float, case: str, shape: str = "unary") -> WrkResult:
        tallies.append(Tally("gateway", f"{name} {case}"))
        return run_wrk(url, conns, seconds, shape_scripts[shape], tallies[-1])

    # per-request CPU of each process, by stack: {(stack, process): [us per 200, one per round]}
    cpu_us: dict[tuple[str, str], list[float]] = {}
    # by shape: {(shape, stack, process): [us per 200]}, {(shape, stack): [ext_proc messages per stream]}
    shape_cpu: dict[tuple[str, str, str], list[float]] = {}
    shape_msgs: dict[tuple[str, str], list[float]] = {}
    worker_rps: dict[int, list[float]] = {}
    with contextlib.ExitStack() as running:
        for s_ in (stack, floor_stack, demo_stack, *worker_stacks.values()):
            running.enter_context(s_)
        targets = {"bare-envoy": f"http://127.0.0.1:{bare_port}/v1/chat/completions",
                   "floor": f"{floor_stack.url}/v1/chat/completions",
                   "modelyard": f"{stack.url}/v1/chat/completions"}
        cpu_targets = {"floor": (floor_stack, targets["floor"]), "minimal": (stack, targets["modelyard"]),
                       "demo": (demo_stack, f"{demo_stack.url}/v1/chat/completions")}
        # Warm up connections and code paths (a smoke run's one round runs the same path).
        modes = {label: processing_mode(s_) for label, (s_, _url) in cpu_targets.items()}
        warm_ups = {} if SMOKE else {**targets, "demo": cpu_targets["demo"][1]}
        for name, url in warm_ups.items():
            load(name, url, 4, 1.0, "warm-up")
        for label, (_stack, url) in ({} if SMOKE else cpu_targets).items():
            load(label, url, 4, 1.0, "stream warm-up", "stream")
        for n, s_ in ({} if SMOKE else worker_stacks).items():
            load(f"workers={n}", f"{s_.url}/v1/chat/completions", 16, 1.0, "warm-up")
        results: dict[tuple[str, int], list[WrkResult]] = {}
        for i in range(a.rounds):
            for conns in (1, 16):
                for name, url in targets.items():
                    run = load(name, url, conns, a.seconds, f"c={conns} round {i + 1}")
                    results.setdefault((name, conns), []).append(run)
            worker_rps.setdefault(1, []).append(results[("modelyard", 16)][-1].ok_rps)
            for n, s_ in worker_stacks.items():
                worker_rps.setdefault(n, []).append(
                    load(f"workers={n}", f"{s_.url}/v1/chat/completions", 16, a.seconds, f"c=16 round {i + 1}").ok_rps)
            for shape in shape_scripts:
                for label, (s_, url) in cpu_targets.items():
                    pids = {name: _pid(s_, name) for name in ("extproc", "envoy")}
                    stats_before = extproc_stats(s_)
                    before = {p: cpu_seconds(pid) for p, pid in pids.items()}
                    run = load(f"{label} cpu {shape}", url, 16, a.seconds, f"c=16 round {i + 1}", shape)
                    used = {p: cpu_seconds(pid) - before[p] for p, pid in pids.items()}
                    stats = extproc_stats(s_)
                    if not run.tally.ok:
                        continue
                    for p in pids:
                        shape_cpu.setdefault((shape, label, p), []).append(used[p] / run.tally.ok * 1e6)
                        if shape == "unary":
                            cpu_us.setdefault((label, p), []).append(used[p] / run.tally.ok * 1e6)
                    streams = stats.get("streams_started", 0) - stats_before.get("streams_started", 0)
                    if streams:
                        shape_msgs.setdefault((shape, label), []).append(
                            (stats.get("stream_msgs_sent", 0) - stats_before.get("stream_msgs_sent", 0)) / streams)
        memory = {name: peak_rss_mb(_pid(stack, child))
                  for name, child in (("extproc", "extproc"), ("modelyard envoy", "envoy"),
                                      ("bare envoy", "bare-envoy"))}
    # req/s counts expected (200) responses only; latency is wrk's over every response, so it is
    # reported only for cases where every response was a 200.
    print(f"{'case':<22}{'ok req/s':>10}{'p50 ms':>10}{'p99 ms':>10}{'ratio':>8}")
    for conns in (1, 16):
        med: dict[str, dict[str, float]] = {}
        clean: dict[str, bool] = {}
        for name in targets:
            runs = results[(name, conns)]
            clean[name] = not any(r.tally.unexpected for r in runs)
            med[name] = {"rps": statistics.median(r.ok_rps for r in runs),
                         "p50_ms": statistics.median(r.p50_ms for r in runs),
                         "p99_ms": statistics.median(r.p99_ms for r in runs)}
        for name in targets:
            m = med[name]
            base = med["bare-envoy"]["rps"]
            ratio = m["rps"] / base if base else float("nan")
            if not clean[name]:
                print(f"{name + f' c={conns}':<22}{m['rps']:>10.0f}{'-':>10}{'-':>10}{ratio:>8.2f}  FAILED")
                continue
            print(f"{name + f' c={conns}':<22}{m['rps']:>10.0f}{m['p50_ms']:>10.2f}{m['p99_ms']:>10.2f}{ratio:>8.2f}")
            for metric, unit in (("rps", "req/s"), ("p50_ms", "ms"), ("p99_ms", "ms")):
                row = {"bench": "gateway", "case": f"{name} c={conns}", "metric": metric, "value": round(m[metric], 3),
                       "unit": unit}
                if name != "bare-envoy" and clean["bare-envoy"]:
                    row["baseline"] = round(med["bare-envoy"][metric], 3)
                    row["ratio"] = round(m[metric] / med["bare-envoy"][metric], 3)
                rows.append(row)
            if conns == 1 and name != "bare-envoy" and clean["bare-envoy"]:
                added = m["p50_ms"] - med["bare-envoy"]["p50_ms"]
                print(f"{'':<22}added p50 over bare Envoy: {added:.2f} ms")
                rows.append({"bench": "gateway", "case": f"{name} c=1", "metric": "added_p50_ms",
                             "value": round(added, 3), "unit": "ms"})
    print("\nCPU per 200 at c=16 (us, median of rounds): " + ", ".join(
        f"{label} {p} {statistics.median(v):.0f}" for (label, p), v in cpu_us.items()))
    for (label, p), v in cpu_us.items():
        row = {"bench": "gateway", "case": f"{label} c=16", "metric": f"{p}_cpu_us",
               "value": round(statistics.median(v), 1), "unit": "us/req"}
        floor = cpu_us.get(("floor", p))
        if label != "floor" and floor:
            row.update(baseline=round(statistics.median(floor), 1),
                       ratio=round(statistics.median(v) / statistics.median(floor), 3))
        rows.append(row)
    print("\nby shape, c=16, median of rounds: CPU per request (Envoy + extproc), above the floor, ext_proc "
          "messages, and the replies each request waits on in turn")
    for shape in shape_scripts:
        floor_total = sum(statistics.median(shape_cpu[(shape, "floor", p)]) for p in ("extproc", "envoy")
                          if shape_cpu.get((shape, "floor", p)))
        for label in cpu_targets:
            if not all(shape_cpu.get((shape, label, p)) for p in ("extproc", "envoy")):
                continue
            total = sum(statistics.median(shape_cpu[(shape, label, p)]) for p in ("extproc", "envoy"))
            msgs = statistics.median(shape_msgs[(shape, label)]) if shape_msgs.get((shape, label)) else float("nan")
            above = total - floor_total
            share = f", {above:.0f} us above the floor ({above / total:.0%} of it)" if label != "floor" else ""
            waits = sequential_waits(modes[label])
            print(f"  {shape:<7}{label:<9}{total:>7.0f} us/req{share}; {msgs:.1f} ext_proc messages per request, "
                  f"{waits} sequential waits")
            rows.append({"bench": "gateway", "case": f"{label} {shape}", "metric": "sequential_waits",
                         "value": waits, "unit": "waits/req"})
            rows.append({"bench": "gateway", "case": f"{label} {shape} c=16", "metric": "gateway_cpu_us",
                         "value": round(total, 1), "unit": "us/req", "baseline": round(floor_total, 1),
                         "ratio": round(total / floor_total, 3) if floor_total else None})
            rows.append({"bench": "gateway", "case": f"{label} {shape}", "metric": "extproc_msgs",
                         "value": round(msgs, 2), "unit": "msgs/req"})
            if label != "floor":
                rows.append({"bench": "gateway", "case": f"{label} {shape} c=16", "metric": "above_floor_us",
                             "value": round(above, 1), "unit": "us/req", "baseline": round(total, 1),
                             "ratio": round(above / total, 3)})
    print("\nminimal config, c=16, by extproc workers (ok req/s, median of rounds): " + ", ".join(
        f"{n}: {statistics.median(v):.0f}" for n, v in sorted(worker_rps.items())))
    for n, v in sorted(worker_rps.items()):
        row = {"bench": "gateway", "case": f"minimal workers={n} c=16", "metric": "rps",
               "value": round(statistics.median(v), 1), "unit": "req/s"}
        if n != 1:
            row.update(baseline=round(statistics.median(worker_rps[1]), 1),
                       ratio=round(statistics.median(v) / statistics.median(worker_rps[1]), 3))
        rows.append(row)
    print("\npeak RSS after the load (MB): " + ", ".join(f"{k} {v:.0f}" for k, v in memory.items()))
    for name, mb in memory.items():
        row = {"bench": "gateway", "case": name, "metric": "peak_rss", "value": round(mb, 1), "unit": "MB"}
        if name == "modelyard envoy":
            row.update(baseline=round(memory["bare envoy"], 1), ratio=round(mb / memory["bare envoy"], 3))
        rows.append(row)
    print("SUMMARY " + json.dumps(rows))
    return report(tallies)


if __name__ == "__main__":
    raise SystemExit(scratch.run(main))
