"""One atomic reload of the extproc: models, deployments, tenants and keys, rate limits, `max_inflight` and
queues, routing, watermark sources, warm-ups and health checks, all from one config.

Two steps. `prepare` builds every config-derived part of a new `Gateway` snapshot (catalog, keyring,
scheduler, dispatcher, accountant, the slot and queue plan, the limiter's rules) and changes nothing: a
config that fails anywhere raises `ConfigError` and the running one is untouched. `commit` is synchronous
and cannot fail, so nothing else runs between its steps on the event loop: it hands the long-lived state
on to the new parts and swaps the snapshot with one reference assignment (`LiveGateway.current`).

What survives a reload: token-bucket levels (the limiter is the same object, its rules swapped); a
deployment's queue, waiters and slots while it exists (`max_inflight` applies to the next grants); routing
feedback and cooldowns of clusters that remain (one `Feedback` object); the warming set and fast-channel
trial counts; watermark pollers whose source is unchanged. In-flight streams keep the snapshot they
started with. A removed deployment's waiters get the error for a model that is gone (or a 503 to retry
when the model remains elsewhere), never a hang; its slots in use are handed back when their calls end.

Needs a restart (reported, not applied): `extproc.*` (addresses, workers, stores, tracing, tasks) and the
`controlplane` section; a change of `ratelimit.backend` or its Redis settings is refused, as before.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from contracts.config import GatewayConfig, parse_config
from contracts.config.ratelimit import RateLimitConfig
from contracts.errors import ConfigError
from contracts.live_config import config_version
from extproc.accounting import Accountant
from extproc.admission.auth import KeyRing
from extproc.admission.concurrency import LimitsPlan
from extproc.admission.dispatch import Dispatcher
from extproc.admission.waking import Waker
from extproc.cache.part import ResponseCache
from extproc.catalog import Catalog
from extproc.gateway import Gateway, LiveGateway, guardrail_policies
from extproc.mcp.part import McpHub
from extproc.routing import Scheduler
from extproc.telemetry.audit import CONFIG_RELOAD, LIMITS_CHANGE, AuditEvent
from extproc.telemetry.metrics import CONFIG_INFO, CONFIG_RELOADS, IMAGE_BACKEND
from extproc.telemetry.redaction import Redactor
from extproc.telemetry.warmup import Warmer
from kernels import select_backend
from ratelimit.rules import RuleSet

log = logging.getLogger("modelyard.reload")
# libyaml's safe loader when built in: the pure-Python one takes a tenth of a second per demo config.
_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)

# What a reload applies (the audit row's `applied`): everything the request path reads from config.
APPLIED = ("models", "deployments", "tenants", "keys", "routing", "ratelimit", "max_inflight", "queues",
           "watermarks", "warmup", "health_checks", "audit_capture")
# Read once at start: a change is reported as needing a restart, and the running value stays.
_RESTART = ("extproc", "controlplane", "keys")


@dataclass(frozen=True)
class Outcome:
    """One reload, applied or refused: what the audit row, the log and the control plane's ack say."""

    ok: bool
    source: str  # sighup | controlplane | api
    version_before: str
    version: str
    error: str = ""
    changes: dict[str, list[str]] = field(default_factory=dict)
    restart_needed: tuple[str, ...] = ()
    applied_by: str = ""  # who applied it at the control plane (`modelyard apply` sends a name), for the audit row


@dataclass
class Prepared:
    """A new snapshot, built and checked, not yet visible to anyone."""

    gateway: Gateway
    limits: LimitsPlan
    changes: dict[str, list[str]]
    restart_needed: tuple[str, ...]


def parse_text(text: bytes, source: str) -> GatewayConfig:
    """A config file's bytes as the running config would be loaded (ConfigError when it does not validate)."""
    try:
        data = yaml.load(text, Loader=_LOADER)
    except yaml.YAMLError as e:
        raise ConfigError(f"{source}: not valid YAML ({e})") from None
    return parse_config(data, source)


def prepare(gw: Gateway, config: GatewayConfig) -> Prepared:
    """Every config-derived part of the next snapshot; raises ConfigError and changes nothing when any fails."""
    old = gw.config
    restart = tuple(sorted(
        f"{section}.{name}" for section in _RESTART
        for name in type(getattr(old, section)).model_fields
        if name not in ("address", "metrics_address")
        and getattr(getattr(old, section), name) != getattr(getattr(config, section), name)))
    # Read once at start (worker i's shifted addresses included): the running values stay.
    config = config.model_copy(update={section: getattr(old, section) for section in _RESTART})
    limiter = gw.dispatcher.limiter
    try:
        if limiter is not None:
            cur, rl = limiter.config, config.ratelimit
            if rl.backend != cur.backend or (rl.backend == "redis" and rl.redis != cur.redis):
                raise ValueError("ratelimit.backend: changing the backend or redis settings needs a restart")
            RuleSet(rl)  # the rules the commit swaps in, checked now
        scheduler = Scheduler(config)
    except ValueError as e:  # ConfigError included
        raise ConfigError(str(e)) from None
    running = gw.dispatcher.scheduler
    # One of each across snapshots: a request that started before records into the same feedback.
    scheduler.feedback, scheduler.admission, scheduler.warming = running.feedback, running.admission, running.warming
    scheduler.latency = running.latency  # the measured latencies span snapshots; commit retunes the objectives
    scheduler.carry_learning(running)  # the bandit's evidence and unchanged group breakers span snapshots
    image_backend = gw.image_backend
    if image_backend is None and any(m.vision is not None for m in config.models):
        image_backend = select_backend(config.extproc.image_backend)
    # The store's keys are one cache across snapshots (its refresher keeps filling it).
    keyring = KeyRing(config.tenants, gw.key_admin.cache if gw.key_admin is not None else None, gw.key_admin)
    catalog = Catalog(config)
    limits = gw.dispatcher.limits
    try:  # last: the only step that opens anything (a host slot table), discarded if the commit never comes
        plan = limits.plan(config)
    except (OSError, ValueError) as e:
        raise ConfigError(f"max_inflight: {e}") from None
    dispatcher = Dispatcher(scheduler, limiter, gw.dispatcher.watermarks, limits, decisions=gw.dispatcher.decisions,
                            budgets=gw.budgets)  # the ledger spans snapshots: spend is never reset by a reload
    dispatcher._failing_open = gw.dispatcher._failing_open  # its gauges stay balanced across the swap
    accountant = Accountant(scheduler, limiter, gw.accountant.metering, budgets=gw.budgets)
    accountant._background = gw.accountant._background  # the close waits for every snapshot's reconciliations
    response_cache = gw.response_cache
    if response_cache is None:  # the first cache policy arrives by reload: its store opens now (docs/cache.md)
        response_cache = ResponseCache.from_config(config)
    # MCP servers and tool permissions apply live; client sessions and upstream connections stay.
    mcp = gw.mcp.reconfigured(config) if gw.mcp is not None else McpHub.from_config(config)
    new = dataclasses.replace(gw, config=config, keyring=keyring, catalog=catalog, dispatcher=dispatcher,
                              accountant=accountant, image_backend=image_backend, response_cache=response_cache,
                              mcp=mcp, guardrails=guardrail_policies(config))  # docs/guardrails.md
    return Prepared(new, plan, _changes(old, config), restart)


def commit(live: LiveGateway, ready: Prepared, version: str, warmer: Warmer | None = None,
           waker: Waker | None = None) -> None:
    """Swap `ready` in: synchronous and infallible, so no request sees half of it."""
    gw, config = ready.gateway, ready.gateway.config
    clusters = config.clusters()
    limiter = gw.dispatcher.limiter
    if limiter is not None:
        limiter.reload(config.ratelimit)  # bucket levels stay; checked in prepare
    scheduler = gw.dispatcher.scheduler
    scheduler.feedback.retune(config.routing.feedback, config.routing.cooldown, clusters)
    scheduler.admission.tiers = dict(config.routing.admission)
    scheduler.latency.retune({c: d.slo for c, d in clusters.items() if d.slo is not None})
    scheduler.warming.intersection_update(clusters)
    gw.dispatcher.limits.apply(ready.limits)
    if gw.watermarks is not None:
        gw.watermarks.reconfigure({c: d.watermark for c, d in clusters.items() if d.watermark is not None},
                                  config.routing.watermarks.interval_s)
    if gw.replicas is not None:
        gw.replicas.reconfigure(list(clusters.values()))
    if gw.audit is not None:
        gw.audit.set_captures({t.name: t.audit for t in config.tenants})
    if gw.image_backend is not None and gw.image_backend is not live.current.image_backend:
        IMAGE_BACKEND.labels(gw.image_backend.name).set(1)  # the first vision model: the path picked now
    if gw.key_admin is not None:  # the admin API checks new keys' tenants and models against this config
        gw.key_admin.config = config
    if gw.batches is not None:  # native batches: the deployments, prices and tiers their poller reads
        gw.batches.config = config
    live.current = gw  # the swap: every stream from here on gets the new snapshot
    before, live.version = live.version, version
    show_version(before, version)
    if warmer is not None:  # as on SIGHUP before: every deployment's server may have been restarted too
        warmer.reconfigure(config, scheduler)
        warmer.warm_all()
    if waker is not None:  # scale_from_zero gained, lost or changed applies now, not at the next start
        waker.reconfigure(config)


def show_version(before: str, after: str) -> None:
    """`modelyard_config_info{version}`: one series, the running version's."""
    if before and before != after:
        with contextlib.suppress(KeyError):
            CONFIG_INFO.remove(before)
    CONFIG_INFO.labels(after).set(1)


class Reloader:
    """Applies a config (file bytes) to the running snapshot and says so in the log, metrics and audit log.
    Parsing runs in a worker thread; reloads are applied one at a time, in the order they came."""

    def __init__(self, live: LiveGateway, warmer: Warmer | None = None, waker: Waker | None = None) -> None:
        self.live = live
        self.warmer = warmer
        self.waker = waker
        self._one_at_a_time = asyncio.Lock()

    async def apply_text(self, text: bytes, *, source: str, origin: str, applied_by: str = "") -> Outcome:
        """`origin`: where the text came from (a path, the control plane's address), for errors and the audit."""
        version = config_version(text)
        async with self._one_at_a_time:
            try:
                config = await asyncio.to_thread(parse_text, text, origin)  # YAML and validation: off the loop
            except ConfigError as e:
                return self._refused(e, version, source, origin, applied_by)
            return self.apply(config, version=version, source=source, origin=origin, applied_by=applied_by)

    def apply(self, config: GatewayConfig, *, version: str, source: str, origin: str = "",
              applied_by: str = "") -> Outcome:
        before = self.live.version
        old_limits = self.live.current.dispatcher.limiter.config if self.live.current.dispatcher.limiter else None
        try:
            ready = prepare(self.live.current, config)
        except ConfigError as e:
            return self._refused(e, version, source, origin, applied_by)
        commit(self.live, ready, version, self.warmer, self.waker)
        out = Outcome(True, source, before, version, changes=ready.changes, restart_needed=ready.restart_needed,
                      applied_by=applied_by)
        CONFIG_RELOADS.labels(source, "applied").inc()
        log.info("config %s applied from %s (%s, was %s)%s%s", version, source, origin or "-", before or "-",
                 "".join(f"; {k}: {', '.join(v)}" for k, v in out.changes.items()),
                 f"; needs a restart to take effect: {', '.join(out.restart_needed)}" if out.restart_needed else "")
        self._audit(CONFIG_RELOAD, 200, {**self._row(out, origin), "applied": list(APPLIED),
                                         "changes": out.changes, "restart_needed": list(out.restart_needed)})
        new_limits = self.live.current.dispatcher.limiter.config if self.live.current.dispatcher.limiter else None
        if old_limits is not None and new_limits is not None and _limits_view(old_limits) != _limits_view(new_limits):
            self._audit(LIMITS_CHANGE, 200, {"before": _limits_view(old_limits), "after": _limits_view(new_limits)})
        return out

    async def reload_file(self, path: Path, *, source: str = "sighup") -> Outcome:
        """The file re-read and applied: SIGHUP's path."""
        try:
            text = await asyncio.to_thread(path.read_bytes)
        except OSError as e:
            return self._refused(ConfigError(f"{path}: cannot read ({e.strerror})"), "", source, str(path))
        return await self.apply_text(text, source=source, origin=str(path))

    def _refused(self, e: ConfigError, version: str, source: str, origin: str, applied_by: str = "") -> Outcome:
        out = Outcome(False, source, self.live.version, version, error=str(e), applied_by=applied_by)
        CONFIG_RELOADS.labels(source, "refused").inc()
        log.error("config %s from %s refused, keeping %s: %s", version or "-", source, self.live.version or "-", e)
        # The reason may quote the file (a Redis URL with a password): redacted like a body.
        self._audit(CONFIG_RELOAD, 400, {**self._row(out, origin), "applied": [],
                                         "error": Redactor().redact(str(e))[:500]})
        return out

    @staticmethod
    def _row(out: Outcome, origin: str) -> dict[str, object]:
        # `version` is the first 16 hex digits of the sha256 the SIGHUP-only rows carried before.
        row: dict[str, object] = {"source": out.source, "path": origin, "version_before": out.version_before,
                                  "version": out.version}
        if out.applied_by:
            row["applied_by"] = out.applied_by
        return row

    def _audit(self, event: str, status: int, detail: dict[str, object]) -> None:
        audit = self.live.current.audit
        if audit is not None:
            audit.record(AuditEvent(event=event, time=time.time(), status=status, detail=detail))


def _limits_view(cfg: RateLimitConfig) -> dict[str, object]:
    return {"enabled": cfg.enabled, "enforce": cfg.enforce,
            "limits": [r.model_dump(exclude_none=True) for r in cfg.limits]}


def _changes(old: GatewayConfig, new: GatewayConfig) -> dict[str, list[str]]:
    """What differs, by name (the audit row and the log line; never a key digest or a credential)."""
    out: dict[str, list[str]] = {}

    def diff(kind: str, a: dict[str, object], b: dict[str, object]) -> None:
        for label, names in (("added", [n for n in b if n not in a]), ("removed", [n for n in a if n not in b]),
                             ("changed", [n for n in b if n in a and a[n] != b[n]])):
            if names:
                out[f"{kind}_{label}"] = sorted(names)

    diff("models", {m.name: m for m in old.models}, {m.name: m for m in new.models})
    diff("deployments", dict(old.clusters()), dict(new.clusters()))
    diff("tenants", {t.name: t for t in old.tenants}, {t.name: t for t in new.tenants})
    for section in ("routing", "ratelimit", "guardrails"):
        if getattr(old, section) != getattr(new, section):
            out.setdefault("sections_changed", []).append(section)
    return out
