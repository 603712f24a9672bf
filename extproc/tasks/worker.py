"""The task worker: a background task in the extproc that claims stored tasks and replays each
through Envoy's listener with a replay marker, so it takes the very path a synchronous call takes
(routing, translation, failover, batching, limits, metering), then stores the answer's body.

A lease, renewed while the replay runs, says the task is alive; a crash leaves it to expire and
any worker (this one after a restart, or another replica) retries the task once, marked.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
import uuid
from collections.abc import Callable

import aiohttp
from yarl import URL

from contracts.envoy_names import TASK_ID_HEADER
from extproc.tasks import state
from extproc.tasks.identity import UndecodableAnswer, identity_body, replay_headers
from extproc.tasks.marker import MARKER_HEADER, ReplayMarker
from extproc.tasks.state import TaskRecord
from extproc.tasks.store import TaskStore

log = logging.getLogger("modelyard.tasks")

_POLL_S = 1.0  # tasks another replica queued, or leases that ran out, are found this often
_PURGE_EVERY_S = 60.0
_CLOSE_GRACE_S = 3.0


class TaskWorker:
    def __init__(self, store: TaskStore, marker: ReplayMarker, replay_url: str, *, concurrency: int,
                 lease_s: float, replay_timeout_s: float, ttl_s: float,
                 on_final: Callable[[TaskRecord], None]) -> None:
        self.store = store
        self.marker = marker
        self.replay_url = replay_url.rstrip("/")
        self.concurrency = concurrency
        self.lease_s = lease_s
        self.replay_timeout_s = replay_timeout_s
        self.ttl_s = ttl_s
        self.on_final = on_final
        self.owner = uuid.uuid4().hex  # this process's claims; a restarted one is a new owner
        self._wake = asyncio.Event()
        self._running: dict[str, asyncio.Task[None]] = {}
        self._loop_task: asyncio.Task[None] | None = None
        self._http: aiohttp.ClientSession | None = None
        self._claiming = False
        self._reachable = False

    def wake(self) -> None:
        self._wake.set()

    def start(self) -> None:
        self._http = aiohttp.ClientSession(auto_decompress=False)
        self._claiming = True
        self._loop_task = asyncio.get_running_loop().create_task(self._loop(), name="task-worker")

    def stop_claiming(self) -> None:
        """SIGTERM: take no new task; those running finish while the server drains."""
        self._claiming = False
        self._wake.set()

    def abort(self, task_id: str) -> None:
        """Cancelled by the caller: drop the replay (Envoy resets the upstream call)."""
        t = self._running.get(task_id)
        if t is not None:
            t.cancel()

    async def close(self) -> None:
        self._claiming = False
        if self._loop_task is not None:
            self._loop_task.cancel()
            await asyncio.gather(self._loop_task, return_exceptions=True)
        if self._running:
            # Replays whose answer just came back through the drained server store it now.
            await asyncio.wait(list(self._running.values()), timeout=_CLOSE_GRACE_S)
        # Still running after that: left under their lease, retried (once) after restart.
        for t in list(self._running.values()):
            t.cancel()
        await asyncio.gather(*self._running.values(), return_exceptions=True)
        if self._http is not None:
            await self._http.close()

    async def _gateway_reachable(self) -> bool:
        """Envoy is up and reaches this gateway's extproc (answers carry our task id header): a
        replay sent before that would come back as Envoy's own error, not the task's answer."""
        assert self._http is not None
        try:
            async with self._http.get(self.replay_url + "/v2/health/ready",
                                      timeout=aiohttp.ClientTimeout(total=5.0)) as r:
                await r.read()
                return r.status == 200 and TASK_ID_HEADER in r.headers
        except (TimeoutError, aiohttp.ClientError):
            return False

    async def _loop(self) -> None:
        next_purge = 0.0
        while self._claiming:
            try:
                if not self._reachable:
                    self._reachable = await self._gateway_reachable()
                if self._reachable:
                    await self._fill()
                now = time.time()
                if now >= next_purge:
                    next_purge = now + _PURGE_EVERY_S
                    await self.store.purge(now, self.ttl_s)
            except Exception:  # a store hiccup must not end the worker
                log.exception("task worker: claiming failed; trying again")
            self._wake.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), _POLL_S)

    async def _fill(self) -> None:
        while self._claiming and len(self._running) < self.concurrency:
            rec = await self.store.claim_next(time.time(), self.owner, self.lease_s)
            if rec is None:
                return
            if rec.status != "running":  # interrupted twice: failed by the claim itself
                log.warning("task %s: interrupted twice; failed", rec.id)
                self.on_final(rec)
                continue
            if rec.retried:
                log.warning("task %s: its run was interrupted; retrying once (attempt %d)", rec.id, rec.attempts)
            else:
                log.info("task %s: running", rec.id)
            task = asyncio.get_running_loop().create_task(self._run(rec), name=f"task-{rec.id}")
            self._running[rec.id] = task
            task.add_done_callback(functools.partial(self._ended, rec.id))

    def _ended(self, task_id: str, _task: asyncio.Task[None]) -> None:
        self._running.pop(task_id, None)
        self._wake.set()  # a free slot: claim the next one now

    async def _run(self, rec: TaskRecord) -> None:
        try:
            await self._run_once(rec)
        except Exception:  # the store failed under us: the lease runs out and the task is retried, marked
            log.exception("task %s: could not record the run's outcome", rec.id)

    async def _run_once(self, rec: TaskRecord) -> None:
        beat = asyncio.get_running_loop().create_task(self._heartbeat(rec.id, asyncio.current_task()))
        try:
            status, coded, coding, headers, ours = await self._replay(rec)
        except aiohttp.ClientConnectorError:
            # Envoy is not reachable: the request never ran, so the attempt does not count.
            log.warning("task %s: Envoy unreachable at %s; requeued", rec.id, self.replay_url)
            await self.store.update(rec.id, lambda r: state.release(r, self.owner))
            self._unreachable()
            return
        except TimeoutError:
            await self._complete(rec.id, None, None, f"no answer within {self.replay_timeout_s:.0f}s")
            return
        except aiohttp.ClientError as e:
            await self._complete(rec.id, None, None, f"the replay broke off ({type(e).__name__})")
            return
        finally:
            beat.cancel()
        if not ours:
            # Envoy answered for itself (no extproc reached, or it died under the request).
            log.warning("task %s: Envoy answered %d without the gateway; requeued as a retry", rec.id, status)
            await self.store.update(rec.id, lambda r: state.requeue(r, self.owner))
            self._unreachable()
            return
        try:  # inflating is CPU work the size of the answer: off the event loop
            body = await asyncio.to_thread(identity_body, coded, coding) if coding else coded
        except UndecodableAnswer as e:  # stored as it came, a poll would read bytes nobody can decode
            await self._complete(rec.id, None, None, str(e))
            return
        await self._complete(rec.id, status, body, None, headers)

    def _unreachable(self) -> None:
        self._reachable = False
        self._wake.set()

    async def _complete(self, task_id: str, status: int | None, body: bytes | None, error: str | None,
                        headers: tuple[tuple[str, str], ...] = ()) -> None:
        done = await self.store.update(task_id, lambda r: state.complete(r, time.time(), self.owner, status, body,
                                                                         error, headers))
        if done is not None:
            log.info("task %s: %s (HTTP %s)", task_id, done.status, status)
            self.on_final(done)

    async def _replay(self, rec: TaskRecord) -> tuple[int, bytes, str | None, tuple[tuple[str, str], ...], bool]:
        """Status, body as it came, its content-encoding, the result headers kept, and whether the
        gateway answered; the replay asks for identity, so the coding is normally absent."""
        assert self._http is not None
        req = rec.request
        headers = [*replay_headers(req.headers), (MARKER_HEADER, self.marker.sign(rec.id, rec.tenant))]
        url = URL(self.replay_url + req.path, encoded=True)
        async with self._http.request(req.method, url, data=req.body, headers=headers,
                                      timeout=aiohttp.ClientTimeout(total=self.replay_timeout_s)) as r:
            kept = tuple((k, r.headers[k]) for k in state.RESULT_HEADERS if k in r.headers)
            return (r.status, await r.read(), r.headers.get("content-encoding"), kept,
                    TASK_ID_HEADER in r.headers)

    async def _heartbeat(self, task_id: str, runner: asyncio.Task[None] | None) -> None:
        """Renew the lease; a task cancelled meanwhile (here or on another replica) stops its replay."""
        while True:
            await asyncio.sleep(self.lease_s / 3)
            try:
                kept = await self.store.update(task_id, lambda r: state.renew(r, time.time(), self.owner,
                                                                              self.lease_s))
            except Exception:
                log.exception("task %s: lease renewal failed", task_id)
                continue
            if kept is None and runner is not None:
                runner.cancel()
                return
