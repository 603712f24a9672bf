"""`modelyard`: the command line. Each subcommand is a thin front for a module that does the work."""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import sqlite3
import sys
from collections.abc import Callable
from pathlib import Path

from contracts.config import hash_api_key, load_config
from contracts.errors import ConfigError


def _logging(level: str) -> None:
    logging.basicConfig(level=level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")


# Subcommands import their module when run: `modelyard hash-key` need not load grpc, Envoy's protos
# or NumPy.
def _cmd_serve(a: argparse.Namespace) -> int:
    from extproc.service import serve

    # A standby has paid for its imports (most of a start) and waits for a line on stdin: its
    # supervisor's word to take over a dead extproc (devstack.child). EOF: the supervisor is gone.
    if a.standby:
        print(f"modelyard serve: standby {os.getpid()} imported; waiting to take over", flush=True)
        if not sys.stdin.buffer.readline():
            return 0
    try:
        return serve(a.config, worker=a.worker)
    except OSError as e:  # an address in use, say: one line, not a traceback
        print(f"modelyard serve: {e}", file=sys.stderr)
        return 1


def _cmd_epp(a: argparse.Namespace) -> int:
    from contracts.config import config_path
    from contracts.config.endpoint_picker import load_endpoint_picker
    from extproc.epp.server import serve_epp

    # Flags alone (--pool and --endpoints/--endpoints-file) need no file; otherwise the usual config path.
    path = a.config or (None if a.pool else config_path(None))
    cfg = load_endpoint_picker(path, pool=a.pool, address=a.address, metrics_address=a.metrics_address,
                               endpoints=a.endpoints.split(",") if a.endpoints else None,
                               endpoints_file=a.endpoints_file)
    return serve_epp(cfg)


def _cmd_up(a: argparse.Namespace) -> int:
    from devstack.launcher import up

    return up(a.config, a.env, run_dir=a.run_dir, admin_port=a.admin_port)


def _cmd_envoy_render(a: argparse.Namespace) -> int:
    from controlplane.ads_bootstrap import render_ads_bootstrap
    from controlplane.bootstrap import render_bootstrap
    from controlplane.environments import load_environment

    cfg, env = load_config(a.config), load_environment(a.env)
    enforce = cfg.ratelimit.enforce
    if env.rate_limit_service and enforce != "envoy":
        print(f"modelyard: warning: environment {env.name} wires Envoy's ratelimit filter to the RLS while "
              f"ratelimit.enforce is {enforce!r}: requests would be charged twice; set `enforce: envoy`",
              file=sys.stderr)
    # With a control plane, Envoy's bootstrap holds only what must be static; the rest comes over ADS.
    text = render_ads_bootstrap(cfg, env) if cfg.controlplane.enabled and not a.static else render_bootstrap(cfg, env)
    if a.output:
        Path(a.output).write_text(text)
    else:
        sys.stdout.write(text)
    return 0


def _audit_db(a: argparse.Namespace) -> str:
    if a.db:
        return str(a.db)
    db = load_config(a.config).extproc.audit_db
    if not db:
        raise ConfigError("extproc.audit_db is not set; pass --db")
    return db


def _cmd_audit_verify(a: argparse.Namespace) -> int:
    from extproc.telemetry.audit import verify

    db = _audit_db(a)
    try:
        report = verify(db, expect_head=a.expect_head)
    except (FileNotFoundError, ValueError, sqlite3.Error) as e:
        print(f"modelyard: audit: {e}", file=sys.stderr)
        return 2
    if report.broken is not None:
        print(f"audit log {db}: BROKEN at {report.broken}", file=sys.stderr)
        return 1
    # Keep the head somewhere this host cannot write: `--expect-head` then catches a removed tail.
    print(f"audit log {db}: {report.rows} rows intact (from row {report.first_id}); "
          f"head {report.last_id}:{report.head}")
    return 0


def _since(a: argparse.Namespace, command: str, flag: str = "since") -> float | None | int:
    """`--since` (or `--until`) as unix seconds (None: unbounded), or exit code 2 after saying what was expected."""
    from contracts.when import parse_when

    value = getattr(a, flag)
    try:
        return float(parse_when(value)) if value else None
    except ValueError:
        print(f"modelyard: {command}: --{flag} {value!r}: expected 7d, 12h, 30m or an ISO date", file=sys.stderr)
        return 2


def _metering_dbs(a: argparse.Namespace) -> list[str]:
    """`--metering-db` as given, else the config's extproc.metering_db (relative to the file, as `up` runs it)."""
    from contracts.config import config_path

    if a.metering_db:
        return list(a.metering_db)
    cfg = config_path(a.config)
    db = load_config(cfg).extproc.metering_db
    if not db:
        raise ConfigError("extproc.metering_db is not set; pass --metering-db")
    return [db if Path(db).is_absolute() else str(cfg.parent / db)]


def _cmd_audit_export(a: argparse.Namespace) -> int:
    from extproc.telemetry.audit import export

    since = _since(a, "audit export")
    if isinstance(since, int):
        return since
    try:
        for line in export(_audit_db(a), since=since, tenant=a.tenant, event=a.event):
            sys.stdout.buffer.write(line)
    except (FileNotFoundError, sqlite3.Error) as e:
        print(f"modelyard: audit: {e}", file=sys.stderr)
        return 2
    sys.stdout.flush()
    return 0


def _cmd_audit_prune(a: argparse.Namespace) -> int:
    from contracts.when import parse_when
    from extproc.telemetry.audit import prune

    try:
        cutoff = parse_when(a.older_than)
    except ValueError:
        print(f"modelyard: audit prune: --older-than {a.older_than!r}: expected 90d, 12h or an ISO date",
              file=sys.stderr)
        return 2
    try:
        result = prune(_audit_db(a), cutoff)
    except (FileNotFoundError, sqlite3.Error) as e:
        print(f"modelyard: audit: {e}", file=sys.stderr)
        return 2
    if not result.pruned_rows:
        print("nothing to prune")
    else:
        print(f"pruned {result.pruned_rows} rows; the chain now starts at row {result.first_kept_id} "
              f"(anchor {result.anchor_hash})")
    return 0


def _cmd_cache(a: argparse.Namespace) -> int:
    import asyncio

    import orjson

    from contracts.config import config_path
    from extproc.cache.report import open_store, stats_view

    cfg = config_path(a.config)
    store = open_store(load_config(cfg), cfg.parent)

    async def run() -> object:
        try:
            if a.op == "stats":
                return stats_view(await store.stats())
            return {"purged": await store.purge(a.tenant, a.model)}
        finally:
            await store.close()

    sys.stdout.write(orjson.dumps(asyncio.run(run()), option=orjson.OPT_INDENT_2 | orjson.OPT_APPEND_NEWLINE).decode())
    return 0


def _cmd_spend(a: argparse.Namespace) -> int:
    from budgets.report import read_calls, render_table, spend_report

    since = _since(a, "spend")
    if isinstance(since, int):
        return since
    try:
        rows = spend_report(read_calls(_metering_dbs(a), since), a.by, since)
    except (FileNotFoundError, sqlite3.Error) as e:
        print(f"modelyard: spend: {e}", file=sys.stderr)
        return 2
    return _report(a, [r.as_dict() for r in rows], lambda: render_table(rows))


def _report(a: argparse.Namespace, rows: list[dict[str, object]], table: Callable[[], str]) -> int:
    """A report command's output: `--json`, one array of its rows, else its table."""
    import orjson

    sys.stdout.write(orjson.dumps(rows, option=orjson.OPT_APPEND_NEWLINE).decode() if a.json else table())
    sys.stdout.flush()
    return 0


def _cmd_route_ab(a: argparse.Namespace) -> int:
    from extproc.routing.ab_readout import read_arm_calls, readout, render_table

    since, until = _since(a, "route ab"), _since(a, "route ab", "until")
    if isinstance(since, int) or isinstance(until, int):
        return 2
    try:
        experiments = readout(read_arm_calls(_metering_dbs(a), since, until), a.min_calls)
    except (FileNotFoundError, sqlite3.Error) as e:
        print(f"modelyard: route ab: {e}", file=sys.stderr)
        return 2
    return _report(a, [e.as_dict() for e in experiments], lambda: render_table(experiments))


def _cmd_route_replay(a: argparse.Namespace) -> int:
    from extproc.routing.replay import candidate, read_logged_calls, render_table, replay

    since, until = _since(a, "route replay"), _since(a, "route replay", "until")
    if isinstance(since, int) or isinstance(until, int):
        return 2
    try:
        settings = load_config(a.config).routing.adaptive
        strategies = [candidate(spec, settings) for spec in a.strategy or ["adaptive"]]
        calls = list(read_logged_calls(_metering_dbs(a), since, until))
    except (ValueError, FileNotFoundError, sqlite3.Error) as e:  # ConfigError included
        print(f"modelyard: route replay: {e}", file=sys.stderr)
        return 2
    results = [g for s in strategies for g in replay(calls, s, settings)]
    return _report(a, [g.as_dict() for g in results], lambda: render_table(results))


def _cmd_controlplane(a: argparse.Namespace) -> int:
    import asyncio

    from contracts.config import config_path
    from controlplane.environments import load_environment
    from controlplane.live.service import run

    try:
        asyncio.run(run(config_path(a.config), load_environment(a.env), watch=a.watch, timeout_s=a.apply_timeout,
                        bind=a.bind))
    except (OSError, RuntimeError) as e:  # an address in use, say
        print(f"modelyard controlplane: {e}", file=sys.stderr)
        return 1
    return 0


def _cmd_apply(a: argparse.Namespace) -> int:
    from controlplane.live.client import apply

    return apply(a.file or a.config, url=a.url, timeout=a.timeout)


def _cmd_status(a: argparse.Namespace) -> int:
    from controlplane.live.client import status

    return status(a.config, url=a.url, as_json=a.json)


def _cmd_hash_key(a: argparse.Namespace) -> int:
    print(f"sha256:{hash_api_key(a.key)}")
    return 0


# Subcommands owned by other modules get their arguments untouched (argparse would eat options).
_DELEGATES: dict[tuple[str, ...], tuple[str, str]] = {
    ("agent",): ("gpuagent.agent", "main"),
    ("probe",): ("modelyard.probe", "main"),
    ("demo",): ("devstack.demo.cli", "main"),
    ("route", "explain"): ("extproc.replicas.explain", "explain_main"),
    ("ratelimit", "tune"): ("ratelimit.tuning.cli", "main"),
    ("ratelimit", "status"): ("ratelimit.status", "main"),
    ("keys",): ("keys.cli", "main"),
}


def _delegated(argv: list[str]) -> int | None:
    for prefix, (module, func) in _DELEGATES.items():
        if tuple(argv[:len(prefix)]) == prefix:
            return getattr(importlib.import_module(module), func)(argv[len(prefix):])
    return None


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="modelyard", description="Multi-model API gateway on Envoy ext_proc")
    p.add_argument("--log-level", default="info")
    sub = p.add_subparsers(dest="command", required=True)

    def with_config(sp: argparse.ArgumentParser) -> argparse.ArgumentParser:
        sp.add_argument("--config", "-c", default=None, help="modelyard.yaml (default: $MODELYARD_CONFIG or ./modelyard.yaml)")
        return sp

    serve = with_config(sub.add_parser("serve", help="run the ext_proc gRPC service"))
    serve.add_argument("--worker", type=int, default=None,
                       help=argparse.SUPPRESS)  # set by worker 0 for the workers it starts (extproc/workers.py)
    serve.add_argument("--standby", action="store_true",
                       help=argparse.SUPPRESS)  # set by `modelyard up` for its warm spare (devstack/child.py)
    serve.set_defaults(func=_cmd_serve)
    epp = with_config(sub.add_parser("epp", help="serve the replica picker as a Gateway API Inference Extension "
                                                 "endpoint picker for one InferencePool (docs/routing.md)"))
    epp.add_argument("--pool", default=None, help="the InferencePool's name (default: endpoint_picker.pool)")
    epp.add_argument("--address", default=None, help="ext_proc gRPC address (default: endpoint_picker.address)")
    epp.add_argument("--metrics-address", default=None, help="Prometheus /metrics address")
    epp.add_argument("--endpoints", default=None, metavar="IP:PORT,...", help="the pool's endpoints")
    epp.add_argument("--endpoints-file", default=None, metavar="PATH",
                     help="a file of the pool's endpoints, re-read when it changes")
    epp.set_defaults(func=_cmd_epp)
    up = with_config(sub.add_parser("up", help="run Envoy, the extproc service and the declared demo upstreams"))
    up.add_argument("--env", default="dev", help="environment: a name in envoy/environments/ or a .yaml file")
    up.add_argument("--run-dir", default=None,
                    help="logs and rendered config (default: devstack.run_dir under the config file's directory)")
    up.add_argument("--admin-port", type=int, default=None,
                    help="Envoy's admin port, 0 for a free one (default: devstack.admin_port, else the environment's)")
    up.set_defaults(func=_cmd_up)

    envoy = sub.add_parser("envoy", help="Envoy configuration").add_subparsers(dest="envoy_cmd", required=True)
    render = with_config(envoy.add_parser("render", help="render the Envoy bootstrap for an environment"))
    render.add_argument("--env", required=True)
    render.add_argument("--output", "-o", default=None)
    render.add_argument("--static", action="store_true",
                        help="every resource inline, even with controlplane.enabled (no control plane needed)")
    render.set_defaults(func=_cmd_envoy_render)

    audit = sub.add_parser("audit", help="the tamper-evident audit log: verify, export, prune").add_subparsers(
        dest="audit_cmd", required=True)

    def with_db(sp: argparse.ArgumentParser) -> argparse.ArgumentParser:
        sp.add_argument("--db", default=None, help="the audit SQLite file (default: extproc.audit_db in the config)")
        return with_config(sp)

    ver = with_db(audit.add_parser("verify", help="check the hash chain; exit 1 naming the first bad row"))
    ver.add_argument("--expect-head", default=None, metavar="ID:HASH",
                     help="a head an earlier verify printed: also fail if rows after it were removed")
    ver.set_defaults(func=_cmd_audit_verify)
    ex = with_db(audit.add_parser("export", help="rows as JSON lines, oldest first"))
    ex.add_argument("--since", default=None, help="7d, 12h, 30m or an ISO date/time (UTC)")
    ex.add_argument("--tenant", default=None)
    ex.add_argument("--event", default=None, help="call, auth_failure, config_reload, limits_change, key_admin, prune")
    ex.set_defaults(func=_cmd_audit_export)
    pr = with_db(audit.add_parser("prune", help="drop rows older than a cutoff; the chain stays verifiable"))
    pr.add_argument("--older-than", required=True, help="90d, 12h or an ISO date/time (UTC)")
    pr.set_defaults(func=_cmd_audit_prune)

    sp = with_config(sub.add_parser("spend", help="spend per key, tenant or model, from the metering store(s)"))
    sp.add_argument("--by", choices=("key", "tenant", "model", "channel", "cluster"), default="tenant")
    sp.add_argument("--since", default=None, help="7d, 12h, 30m or an ISO date/time (UTC); default: everything")
    sp.add_argument("--json", action="store_true", help="a JSON array of rows instead of a table")
    sp.add_argument("--metering-db", action="append", default=[], metavar="PATH",
                    help="a metering SQLite file; repeat for replicas on other hosts (default: extproc.metering_db; "
                         "a host's workers share that one file)")
    sp.set_defaults(func=_cmd_spend)
    cache = sub.add_parser("cache", help="the response cache's store: stats, purge (docs/cache.md)")
    cache_sub = cache.add_subparsers(dest="op", required=True)
    with_config(cache_sub.add_parser("stats", help="entries and bytes, per model and tenant (JSON)")).set_defaults(
        func=_cmd_cache)
    purge = with_config(cache_sub.add_parser("purge", help="drop entries: all, or a tenant's and/or a model's"))
    purge.add_argument("--tenant", default=None)
    purge.add_argument("--model", default=None)
    purge.set_defaults(func=_cmd_cache)
    cp = with_config(sub.add_parser("controlplane", help="serve Envoy over ADS and the extprocs their config; "
                                                          "`modelyard apply` changes it live"))
    cp.add_argument("--env", default="dev", help="environment: a name in envoy/environments/ or a .yaml file")
    cp.add_argument("--watch", action="store_true",
                    help="apply the config file whenever its content changes (a Kubernetes ConfigMap)")
    cp.add_argument("--bind", default=None, metavar="HOST",
                    help="listen on HOST at the ports of controlplane.xds_address and api_address (in a container: "
                         "0.0.0.0; the config's addresses stay what Envoy and the extprocs dial)")
    cp.add_argument("--apply-timeout", type=float, default=30.0,
                    help="seconds an apply waits for Envoy and every worker to confirm (then 504)")
    cp.set_defaults(func=_cmd_controlplane)
    ap = with_config(sub.add_parser("apply", help="validate a config and apply it to the running gateway"))
    ap.add_argument("file", nargs="?", default=None, help="the config (default: --config, $MODELYARD_CONFIG or ./modelyard.yaml)")
    ap.add_argument("--url", default=None, help="the control plane's API (default: the file's controlplane.api_address)")
    ap.add_argument("--timeout", type=float, default=60.0)
    ap.set_defaults(func=_cmd_apply)
    st = with_config(sub.add_parser("status", help="the running config version, and which Envoy and worker has it"))
    st.add_argument("--url", default=None, help="the control plane's API (default: the config's controlplane.api_address)")
    st.add_argument("--json", action="store_true")
    st.set_defaults(func=_cmd_status)

    hk = sub.add_parser("hash-key", help="print the config form of an API key")
    hk.add_argument("key")
    hk.set_defaults(func=_cmd_hash_key)

    # Listed for --help only: main() hands these to their modules before argparse runs.
    sub.add_parser("agent", help="GPU watermark agent (NVML); see `modelyard agent --help`")
    sub.add_parser("probe", help="container health check: `probe grpc|http|tcp TARGET`, exit 0 when healthy")
    sub.add_parser("demo", help="run a demo upstream: openai|anthropic|gemini|kserve")
    route = sub.add_parser("route", help="`route explain`: every candidate for a sample request; "
                                         "`route ab`: the A/B experiments' arms side by side; "
                                         "`route replay`: a strategy scored offline on logged calls")
    route_sub = route.add_subparsers(dest="route_command")
    ab = with_config(route_sub.add_parser(
        "ab", help="per A/B experiment and arm: requests, error rate, latency p50/p99, TTFT, cost per request, "
                   "feedback, with 95% intervals and which arm is better (metering store)"))
    ab.add_argument("--since", default=None, help="7d, 12h, 30m or an ISO date/time (UTC); default: everything")
    ab.add_argument("--until", default=None, help="the same; default: now")
    ab.add_argument("--min-calls", type=int, default=30, help="calls per arm before a verdict (default 30)")
    ab.add_argument("--json", action="store_true", help="a JSON array, one object per experiment")
    ab.add_argument("--metering-db", action="append", default=[], metavar="PATH",
                    help="a metering SQLite file; repeat for replicas on other hosts (default: extproc.metering_db)")
    ab.set_defaults(func=_cmd_route_ab)
    rp = with_config(route_sub.add_parser(
        "replay", help="what a candidate strategy would have earned on the learning strategy's logged calls "
                       "(IPS and self-normalised IPS with 95% intervals, from the metering store)"))
    rp.add_argument("--strategy", action="append", default=[], metavar="SPEC",
                    help="uniform, fixed:<cluster>, adaptive or adaptive:half_life_s=10,floor=0.1; repeat to "
                         "compare (default: adaptive as configured)")
    rp.add_argument("--since", default=None, help="7d, 12h, 30m or an ISO date/time (UTC); default: everything")
    rp.add_argument("--until", default=None, help="the same; default: now")
    rp.add_argument("--json", action="store_true", help="a JSON array, one object per strategy and group")
    rp.add_argument("--metering-db", action="append", default=[], metavar="PATH",
                    help="a metering SQLite file; repeat for replicas on other hosts (default: extproc.metering_db)")
    rp.set_defaults(func=_cmd_route_replay)
    sub.add_parser("ratelimit", help="`ratelimit tune`: limits from recorded traffic; `ratelimit status`: live buckets")
    sub.add_parser("keys", help="virtual keys: `keys create|list|rotate|revoke` (docs/keys.md)")
    return p


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    try:
        delegated = _delegated(argv)
        if delegated is not None:
            return delegated
        a = parser().parse_args(argv)
        _logging(a.log_level)
        return a.func(a)
    except ConfigError as e:
        print(f"modelyard: configuration error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    raise SystemExit(main())
