"""The Gateway's budgets part: may this caller spend now, and what a call cost.

The request path only reads and adds numbers in memory (`refusal`, `record`). A sync thread, every
`interval_s`, writes this process's new spend to the shared ledger (budgets/store.py: every worker
and replica writes there), reads everyone's totals back, sets the budget gauges and claims the
soft-limit webhook of each budget that passed its soft share (one process wins per window).
Between two rounds a process counts its own unflushed spend, so a worker's overshoot is bounded by
what the other workers spent in the last round or two.
"""

from __future__ import annotations

import logging
import sqlite3
import threading
import time
from collections.abc import Callable

from budgets.decision import Scope, SoftAlerts, Standing, refusal, verdict
from budgets.ledger import Ledger
from budgets.periods import PERIODS, day_of, window
from budgets.store import SpendStore, sqlite_path
from budgets.webhook import WebhookSender, payload
from contracts.config import GatewayConfig
from contracts.config.keys import Budget
from contracts.errors import ConfigError
from extproc.context import RequestContext
from extproc.telemetry.metrics import (
    BUDGET_SOFT_CROSSINGS,
    BUDGET_SPENT,
    BUDGET_SYNC_ERRORS,
    BUDGET_USD,
    BUDGET_USED,
)
from keys.db import sqlite_path as keys_sqlite_path

log = logging.getLogger("modelyard.budgets")

INTERVAL_S = 0.5
# Ledger days kept: more than the longest window (a month) plus slack for clocks and late rows.
_KEEP_DAYS = 62
_PRUNE_EVERY_S = 3600.0


def ledger_wanted(config: GatewayConfig) -> bool:
    """A tenant has a budget, or the key store (whose keys may carry budgets) or the webhook is configured."""
    return (any(t.budget is not None for t in config.tenants) or config.keys.store is not None
            or config.keys.budget_webhook is not None)


def _open_store(config: GatewayConfig, dsn: str | None) -> SpendStore:
    if dsn is not None and dsn.startswith(("postgresql://", "postgres://")):
        import psycopg  # only where replicas share a PostgreSQL key store

        def connect() -> psycopg.Connection:
            return psycopg.connect(dsn, connect_timeout=5)

        try:  # reconnect: a PostgreSQL restart must not stop the ledger until the gateway restarts
            return SpendStore(connect(), paramstyle="format", reconnect=connect)
        except psycopg.Error as e:
            raise OSError(str(e).splitlines()[0] if str(e) else type(e).__name__) from None
    if dsn is not None:
        return SpendStore(keys_sqlite_path(dsn))
    return SpendStore(sqlite_path(config.keys.store, config.devstack.run_dir))


class BudgetGuard:
    def __init__(self, store: SpendStore, *, tenant_budgets: dict[str, Budget] | None = None,
                 webhook: WebhookSender | None = None, interval_s: float = INTERVAL_S,
                 clock: Callable[[], float] = time.time):
        self.store = store
        self.ledger = Ledger()
        self.webhook = webhook
        self.interval_s = interval_s
        self.clock = clock
        # (scope, id) -> (tenant, budget): every budget in use, for the gauges and the soft alerts;
        # the request path refreshes it (a key's budget comes with its Caller).
        self._budgets: dict[tuple[Scope, str], tuple[str, Budget]] = {
            ("tenant", name): (name, b) for name, b in (tenant_budgets or {}).items()}
        self._alerts = SoftAlerts()
        self._stop = threading.Event()
        self._pruned_at = 0.0
        self._sync()  # the totals so far, before the first request is checked
        self._thread = threading.Thread(target=self._run, name="budget-sync", daemon=True)
        self._thread.start()

    @classmethod
    def from_config(cls, config: GatewayConfig, dsn: str | None = None) -> BudgetGuard | None:
        """With the key store's `dsn` (every extproc that has one), always on: any store key may
        carry a budget. The ledger's tables live in that store: SQLite, or PostgreSQL for replicas."""
        if dsn is None and not ledger_wanted(config):
            return None
        hook = config.keys.budget_webhook
        where = dsn.rpartition("@")[2] if dsn else str(sqlite_path(config.keys.store, config.devstack.run_dir))
        log.info("budgets: spend ledger in %s%s", where, f"; soft-limit webhook to {hook}" if hook else "")
        try:
            store = _open_store(config, dsn)
        except (OSError, sqlite3.Error) as e:
            raise ConfigError(f"keys.store: cannot open the spend ledger {where}: {e}") from None
        return cls(store, tenant_budgets={t.name: t.budget for t in config.tenants if t.budget},
                   webhook=WebhookSender(hook) if hook else None)

    # ------------------------------------------------------------------ the request path (no I/O)

    def refusal(self, ctx: RequestContext) -> tuple[Standing, int] | None:
        """The spent budget (the key's or the tenant's) that refuses this call and the seconds until
        it resets, or None. A Standing is built only for a budget that refuses."""
        tenant, caller = ctx.tenant, ctx.caller
        tenant_budget = tenant.budget if tenant is not None else None
        key_budget = caller.budget if caller is not None and caller.key_id is not None else None
        if tenant_budget is None and key_budget is None:
            return None  # the common case: nothing to read
        now = self.clock()
        spent: list[Standing] = []
        if tenant is not None and tenant_budget is not None:
            self._budgets[("tenant", tenant.name)] = (tenant.name, tenant_budget)
            self._refuses("tenant", tenant.name, tenant.name, tenant_budget, now, spent)
        if caller is not None and caller.key_id is not None and key_budget is not None:
            self._budgets[("key", caller.key_id)] = (caller.tenant, key_budget)
            self._refuses("key", caller.key_id, caller.tenant, key_budget, now, spent)
        last = refusal(spent)
        return None if last is None else (last, last.retry_after_s(now))

    def _refuses(self, scope: Scope, id: str, tenant: str, budget: Budget, now: float, out: list[Standing]) -> None:
        w = window(budget.period, now)
        usd = self.ledger.spent(scope, id, w)
        if verdict(usd, budget) == "refuse":
            out.append(Standing(scope, id, tenant, budget, usd, w))

    def record(self, ctx: RequestContext, usd: float) -> None:
        """A metered call's cost, counted at once here and in the shared ledger within a round."""
        caller = ctx.caller
        self.record_spend(ctx.tenant_name, caller.key_id if caller is not None else None, usd)

    def record_spend(self, tenant: str, key_id: str | None, usd: float) -> None:
        """Spend with no request of its own (a native batch's lines, metered when the provider ends it)."""
        self.ledger.add(tenant, key_id, usd, self.clock())

    def _standing(self, scope: Scope, id: str, tenant: str, budget: Budget, now: float) -> Standing:
        w = window(budget.period, now)
        return Standing(scope, id, tenant, budget, self.ledger.spent(scope, id, w), w)

    # ------------------------------------------------------------------ the sync thread

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self._sync()
            except Exception:  # a bug must not stop the ledger: the next round tries again
                log.exception("budgets: sync round failed")

    def _sync(self) -> None:
        now = self.clock()
        batch = self.ledger.take()
        if batch:
            try:
                self.store.add([(s, i, d, usd) for (s, i, d), usd in batch.items()])
            except Exception as e:
                BUDGET_SYNC_ERRORS.labels("write").inc()
                log.warning("budgets: ledger write failed (%s); retrying next round", e)
                self.ledger.restore(batch)
        try:  # after the write: the totals hold every write so far, so `install` drops none twice
            windows = [window(p, now) for p in PERIODS]
            self.ledger.install(windows, self.store.totals(windows))
        except Exception as e:
            BUDGET_SYNC_ERRORS.labels("read").inc()
            log.warning("budgets: ledger read failed (%s); counting local spend meanwhile", e)
            return
        standings = [self._standing(scope, id, tenant, b, now)
                     for (scope, id), (tenant, b) in list(self._budgets.items())]
        for s in standings:
            labels = (s.scope, s.id, s.budget.period)
            BUDGET_USED.labels(*labels).set(s.used_ratio)
            BUDGET_SPENT.labels(*labels).set(s.spent)
            BUDGET_USD.labels(*labels).set(s.budget.usd)
        for s in self._alerts.due(standings):
            self._announce(s, now)
        if now - self._pruned_at > _PRUNE_EVERY_S:
            self._pruned_at = now
            self._alerts.forget_before(day_of(now) - _KEEP_DAYS)
            try:
                self.store.prune(day_of(now) - _KEEP_DAYS)
            except Exception as e:
                log.warning("budgets: ledger prune failed (%s)", e)

    def _announce(self, s: Standing, now: float) -> None:
        """Past the soft share: the process that claims this window counts it and sends the webhook."""
        try:
            claimed = self.store.claim_alert(s.scope, s.id, s.budget.period, s.window.first, now)
        except Exception as e:
            BUDGET_SYNC_ERRORS.labels("alert").inc()
            log.warning("budgets: soft-limit claim failed (%s); retrying next round", e)
            self._alerts.retry(s)
            return
        if not claimed:
            return
        BUDGET_SOFT_CROSSINGS.labels(s.scope).inc()
        log.warning("budgets: past the soft share (%g): %s", s.budget.soft_share, s.describe())
        if self.webhook is not None:
            self.webhook.send(payload(s, now))

    def close(self, timeout: float = 10.0) -> None:
        """Stop the thread, write what is still unflushed, then let the webhook drain."""
        self._stop.set()
        self._thread.join(timeout)
        try:
            self._sync()
        finally:
            self.store.close()
            if self.webhook is not None:
                self.webhook.close()
