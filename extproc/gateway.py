"""The process-wide state every session shares, one typed part per job.

`keyring` (who is calling), `catalog` (what is configured), `dispatcher` (where a request goes
and whether it may go now), `accountant` (what happened after), `batcher`, `image_backend` and
`kserve_probe` (vision and KServe work), `audit` (the tamper-evident record of calls and security
events), `key_admin` (the key store: admin writes and the refresh that keeps `keyring` current).
The composition root (`extproc/service.py`) builds it; flows read it and never set a part.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from contracts.config import GatewayConfig
from extproc.accounting import Accountant
from extproc.admission.auth import AdminKeys, KeyRing
from extproc.admission.budget_guard import BudgetGuard
from extproc.admission.concurrency import ConcurrencyLimits
from extproc.admission.dispatch import Dispatcher
from extproc.batches.desk import BatchDesk
from extproc.cache.part import ResponseCache
from extproc.catalog import Catalog
from extproc.guard_hooks import GuardHooks
from extproc.key_admin import KeyAdmin
from extproc.mcp.part import McpHub
from extproc.replicas.board import ReplicaBoard
from extproc.routing import Scheduler
from extproc.tasks.board import TaskBoard
from extproc.telemetry.audit import AuditLog
from extproc.telemetry.metering import MeteringStore
from extproc.telemetry.pollers import WatermarkBoard
from extproc.vision.batching import Batcher
from extproc.vision.kserve_probe import KServeProbe
from guardrails import PolicySet
from kernels import Backend, select_backend
from ratelimit import Limiter

if TYPE_CHECKING:  # tracing is an optional extra, loaded by the composition root when configured
    from extproc.telemetry.tracing import Tracing


@dataclass
class Gateway:
    config: GatewayConfig
    keyring: KeyRing
    catalog: Catalog
    dispatcher: Dispatcher
    accountant: Accountant
    batcher: Batcher | None = None
    image_backend: Backend | None = None  # CuPy on a GPU, else NumPy; picked at start where a model has `vision`
    watermarks: WatermarkBoard | None = None
    # Replica readings and the picker's state for deployments with `replica_metrics` (None: none picked).
    replicas: ReplicaBoard | None = None
    # KServe health, metadata and the binary extension, asked of the upstream (nothing opens until asked).
    kserve_probe: KServeProbe = field(default_factory=KServeProbe)
    tracing: Tracing | None = None  # None: tracing is off and no request gets a span
    audit: AuditLog | None = None
    tasks: TaskBoard | None = None  # async tasks (Prefer: respond-async); off unless configured
    budgets: BudgetGuard | None = None  # spend caps per key and tenant; off unless a budget or key store is set
    # The key store: the admin API's writes and the refresher behind `keyring`'s store keys (off: config keys only).
    key_admin: KeyAdmin | None = None
    admin_keys: AdminKeys = field(default_factory=lambda: AdminKeys([]))
    response_cache: ResponseCache | None = None  # None unless a model has a `cache:` policy (docs/cache.md)
    batches: BatchDesk | None = None  # files and batch APIs (docs/batches.md); off unless configured
    mcp: McpHub | None = None  # /mcp: the MCP servers' gateway (docs/mcp.md); None without mcp_servers
    # The config's guardrail policies, compiled once per snapshot (a reload compiles the new ones).
    guardrails: PolicySet | None = None
    guard_hooks: GuardHooks = field(default_factory=GuardHooks)  # webhook checks' client, opened on first use

    @classmethod
    def build(cls, config: GatewayConfig, *, scheduler: Scheduler | None = None, limiter: Limiter | None = None,
              watermarks: WatermarkBoard | None = None, batcher: Batcher | None = None,
              image_backend: Backend | None = None, metering: MeteringStore | None = None,
              tracing: Tracing | None = None, audit: AuditLog | None = None,
              tasks: TaskBoard | None = None, limits: ConcurrencyLimits | None = None,
              budgets: BudgetGuard | None = None, key_admin: KeyAdmin | None = None,
              replicas: ReplicaBoard | None = None, response_cache: ResponseCache | None = None,
              batches: BatchDesk | None = None, mcp: McpHub | None = None) -> Gateway:
        """The parts wired together; what is not given stays off (tests drive it in memory)."""
        scheduler = scheduler or Scheduler(config)
        if image_backend is None and any(m.vision is not None for m in config.models):
            image_backend = select_backend(config.extproc.image_backend)
        keyring = KeyRing(config.tenants, key_admin.cache if key_admin is not None else None, key_admin)
        return cls(config=config, keyring=keyring, catalog=Catalog(config),
                   dispatcher=Dispatcher(scheduler, limiter, watermarks, limits, decisions=metering, budgets=budgets),
                   accountant=Accountant(scheduler, limiter, metering, budgets=budgets),
                   batcher=batcher, image_backend=image_backend, watermarks=watermarks, replicas=replicas, tracing=tracing,
                   audit=audit, tasks=tasks, budgets=budgets, key_admin=key_admin, admin_keys=AdminKeys(config.keys.admin_keys),
                   response_cache=response_cache, batches=batches,
                   mcp=mcp if mcp is not None else McpHub.from_config(config),
                   guardrails=guardrail_policies(config))

    def start(self) -> None:
        """Background work that needs the server listening: the task worker replays through it."""
        if self.tasks is not None:
            self.tasks.start()
        if self.batches is not None:
            self.batches.start()
        if self.response_cache is not None:  # the semantic index's rebuild
            self.response_cache.start()

    def drain(self) -> None:
        """Shutting down: take no new background work; what runs finishes while streams drain."""
        if self.tasks is not None:
            self.tasks.stop_claiming()

    async def close(self) -> None:
        if self.batches is not None:  # before the tasks: its finalizer reads them
            await self.batches.close()
        if self.tasks is not None:
            await self.tasks.close()
        if self.key_admin is not None:
            await self.key_admin.close()
        await self.accountant.close()
        if self.response_cache is not None:
            await self.response_cache.close()
        if self.mcp is not None:
            await self.mcp.close()
        if self.budgets is not None:  # after the accountant: the last calls' spend is in the ledger
            await asyncio.to_thread(self.budgets.close)
        if self.audit is not None:  # after the streams closed: their rows are queued by now
            await asyncio.to_thread(self.audit.close)
        if self.watermarks is not None:
            await self.watermarks.stop()
        if self.replicas is not None:
            await self.replicas.stop()
        if self.dispatcher.limiter is not None:
            await self.dispatcher.limiter.close()
        await self.dispatcher.limits.close()
        if self.batcher is not None:
            await self.batcher.close()
        await self.kserve_probe.close()
        await self.guard_hooks.close()
        if self.tracing is not None:  # flushes queued spans to the collector: off the event loop
            await asyncio.to_thread(self.tracing.shutdown)


def guardrail_policies(config: GatewayConfig) -> PolicySet | None:
    """The config's guardrails compiled (a build and every reload), or None where there are none."""
    return PolicySet(config.guardrails) if config.guardrails.policies else None


class LiveGateway:
    """The running snapshot: a new stream reads `current` once and keeps that Gateway to its end, so a
    reload (extproc/live/reload.py) is one reference assignment and in-flight requests finish on their config."""

    __slots__ = ("current", "version")

    def __init__(self, gateway: Gateway, version: str = "") -> None:
        self.current = gateway
        self.version = version  # contracts.live_config.config_version of the running file's bytes
