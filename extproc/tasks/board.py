"""The gateway's task part: accept a request as a task, look one up for its tenant, cancel it,
and run the worker that replays them. The session and the /v1/tasks answers call it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import Mapping

import aiohttp
import orjson

from contracts.config import GatewayConfig, TasksConfig
from contracts.errors import ClientError, ConfigError, NotFound, Unavailable
from extproc.tasks import state, webhook
from extproc.tasks.marker import MARKER_HEADER, ReplayMarker
from extproc.tasks.state import TaskRecord
from extproc.tasks.store import SqliteTaskStore, TaskStore
from extproc.tasks.worker import TaskWorker

log = logging.getLogger("modelyard.tasks")

_RESEND_EVERY_S = 60.0
_RESEND_BATCH = 100
_REREAD_S = 0.5  # a long poll re-reads the store this often (another replica may finish the task)


def _store(cfg: TasksConfig) -> TaskStore:
    if cfg.store == "redis":
        from extproc.tasks.redis_store import RedisTaskStore

        return RedisTaskStore(cfg.redis_url, cfg.redis_prefix)
    return SqliteTaskStore(cfg.sqlite_path)


class TaskBoard:
    def __init__(self, cfg: TasksConfig, replay_url: str, store: TaskStore, marker: ReplayMarker,
                 webhook_secrets: Mapping[str, str | None]) -> None:
        self.cfg = cfg
        self.store = store
        self.marker = marker
        self._webhook_env = dict(webhook_secrets)  # tenant -> env var name
        self._waiters: dict[str, asyncio.Event] = {}
        self._deliveries: set[asyncio.Task[None]] = set()
        self._delivering: set[str] = set()  # task ids with a delivery under way
        self._resender: asyncio.Task[None] | None = None
        self._http: aiohttp.ClientSession | None = None
        self.worker = TaskWorker(store, marker, replay_url, concurrency=cfg.concurrency, lease_s=cfg.lease_s,
                                 replay_timeout_s=cfg.replay_timeout_s, ttl_s=cfg.ttl_s, on_final=self._final)

    @classmethod
    def from_config(cls, config: GatewayConfig) -> TaskBoard | None:
        cfg = config.extproc.tasks
        if cfg is None:
            return None
        key = None
        if cfg.secret_env:
            value = os.environ.get(cfg.secret_env)
            if not value:
                raise ConfigError(f"extproc.tasks.secret_env: environment variable {cfg.secret_env} is not set")
            key = value.encode()
        elif cfg.store == "redis":
            log.warning("extproc.tasks: store is redis but no secret_env: a replay another replica checks "
                        "will fail (each process has its own marker key)")
        host = config.listener.address if config.listener.address not in ("0.0.0.0", "::", "") else "127.0.0.1"
        replay_url = cfg.replay_url or f"http://{host}:{config.listener.port}"
        return cls(cfg, replay_url, _store(cfg), ReplayMarker(key),
                   {t.name: t.webhook_secret_env for t in config.tenants})

    # -- the request path ---------------------------------------------------------------------
    def replay_of(self, headers: Mapping[str, str]) -> tuple[str, str] | None:
        """(task id, tenant) when the request is this gateway's own replay of a task."""
        return self.marker.verify(headers.get(MARKER_HEADER))

    def check_callback(self, tenant: str, headers: Mapping[str, str]) -> str | None:
        """The request's webhook URL, refused before anything is accepted when it cannot be signed."""
        url = headers.get(state.CALLBACK_HEADER)
        if not url:
            return None
        if not url.startswith(("http://", "https://")):
            raise ClientError(f"{state.CALLBACK_HEADER} must be an http(s) URL")
        if self._secret(tenant) is None:
            raise ClientError("webhooks are not enabled for this API key (no signing secret is configured)")
        return url

    async def accept(self, task_id: str, tenant: str, protocol: str, request: state.StoredRequest,
                     callback_url: str | None) -> TaskRecord:
        """Stored durably before the caller hears 202: nothing accepted is lost."""
        rec = state.new_task(task_id, tenant, protocol, request, time.time(), callback_url)
        try:
            await self.store.create(rec)
        except Exception as e:  # the store is down: refuse now rather than accept what may be lost
            log.error("task %s: could not be stored (%s)", task_id, type(e).__name__)
            raise Unavailable("the task store is unavailable; retry, or call without Prefer: respond-async",
                              retry_after_s=1.0) from None
        self.worker.wake()
        return rec

    async def accept_many(self, recs: list[TaskRecord]) -> None:
        """A batch's lines, stored durably before the batch is answered."""
        try:
            await self.store.create_many(recs)
        except Exception as e:
            log.error("batch of %d tasks: could not be stored (%s)", len(recs), type(e).__name__)
            raise Unavailable("the task store is unavailable; retry", retry_after_s=1.0) from None
        self.worker.wake()

    async def read_many(self, task_ids: list[str]) -> dict[str, TaskRecord]:
        try:
            return await self.store.get_many(task_ids)
        except Exception as e:
            log.error("%d tasks: could not be read (%s)", len(task_ids), type(e).__name__)
            raise Unavailable("the task store is unavailable", retry_after_s=1.0) from None

    async def cancel_quietly(self, task_id: str) -> None:
        """A batch line cancelled with its batch: the same as `cancel`, without the tenant check."""
        done = await self.store.update(task_id, lambda r: state.cancel(r, time.time()))
        self.worker.abort(task_id)
        if done is not None and done.status == "cancelled":
            self._final(done)

    async def _read(self, task_id: str) -> TaskRecord | None:
        try:
            return await self.store.get(task_id)
        except Exception as e:
            log.error("task %s: could not be read (%s)", task_id, type(e).__name__)
            raise Unavailable("the task store is unavailable", retry_after_s=1.0) from None

    async def lookup(self, task_id: str, tenant: str, wait_s: float = 0.0) -> TaskRecord:
        """The tenant's task, after up to `wait_s` for it to end; another tenant's is a 404."""
        deadline = time.monotonic() + max(wait_s, 0.0)
        while True:
            rec = await self._read(task_id)
            if rec is None or rec.tenant != tenant:
                raise NotFound(f"no task {task_id!r}")
            left = deadline - time.monotonic()
            if rec.final or left <= 0:
                if rec.final:
                    self._waiters.pop(task_id, None)  # it may have ended on another replica
                return rec
            event = self._waiters.setdefault(task_id, asyncio.Event())
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(event.wait(), min(left, _REREAD_S))

    async def cancel(self, task_id: str, tenant: str) -> TaskRecord:
        rec = await self._read(task_id)
        if rec is None or rec.tenant != tenant:
            raise NotFound(f"no task {task_id!r}")
        try:
            done = await self.store.update(task_id, lambda r: state.cancel(r, time.time()))
        except Exception as e:
            log.error("task %s: could not be cancelled (%s)", task_id, type(e).__name__)
            raise Unavailable("the task store is unavailable", retry_after_s=1.0) from None
        self.worker.abort(task_id)
        rec = done or rec
        if rec.status == "cancelled":
            self._final(rec)
        return rec

    # -- completion ----------------------------------------------------------------------------
    def _secret(self, tenant: str) -> bytes | None:
        env = self._webhook_env.get(tenant)
        value = os.environ.get(env) if env else None
        return value.encode() if value else None

    def _final(self, rec: TaskRecord) -> None:
        event = self._waiters.pop(rec.id, None)
        if event is not None:
            event.set()
        if state.owes_webhook(rec) and rec.id not in self._delivering:
            self._delivering.add(rec.id)
            task = asyncio.get_running_loop().create_task(self._notify(rec))
            self._deliveries.add(task)
            task.add_done_callback(self._deliveries.discard)

    async def _resend_owed(self) -> None:
        """Webhooks no receiver took (it was down, or this process died first): at start, then
        every `_RESEND_EVERY_S`. At least once: receivers dedupe by `x-modelyard-task-id`."""
        while True:
            try:
                for rec in await self.store.owed_webhooks(_RESEND_BATCH):
                    self._final(rec)
            except Exception:
                log.exception("tasks: could not read the webhooks still owed")
            await asyncio.sleep(_RESEND_EVERY_S)

    async def _notify(self, rec: TaskRecord) -> None:
        try:
            await self._deliver(rec)
        finally:
            self._delivering.discard(rec.id)

    async def _deliver(self, rec: TaskRecord) -> None:
        secret = self._secret(rec.tenant)
        if secret is None or rec.callback_url is None:
            return
        if self._http is None:
            self._http = aiohttp.ClientSession()
        body = orjson.dumps(state.public_view(rec))
        if await webhook.deliver(self._http, rec.callback_url, rec.id, body, secret):
            await self.store.update(rec.id, state.mark_notified)

    # -- lifecycle ------------------------------------------------------------------------------
    def start(self) -> None:
        self.worker.start()
        self._resender = asyncio.get_running_loop().create_task(self._resend_owed(), name="task-webhooks")

    def stop_claiming(self) -> None:
        self.worker.stop_claiming()

    async def close(self) -> None:
        if self._resender is not None:
            self._resender.cancel()
        await self.worker.close()
        if self._deliveries:
            await asyncio.wait(self._deliveries, timeout=5.0)
        if self._http is not None:
            await self._http.close()
        await self.store.close()

