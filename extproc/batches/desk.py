"""The gateway's batch part: files, and batches whose lines run as async tasks.

Creating a batch stores one task per valid line (each a replay of its own request through Envoy,
so routing, translation, limits and metering are a synchronous call's), then the batch record.
A finalizer checks open batches every `finalize_every_s`: once every line task has ended it writes
the output and error files (or Anthropic's results) and closes the batch. Tasks and records are
durable, so a batch survives an extproc restart: its lines are the task engine's to resume.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import orjson

from contracts.config import BatchesConfig, Deployment, GatewayConfig
from contracts.errors import ClientError, ModelyardError, NotFound, Unavailable
from extproc.admission.budget_guard import BudgetGuard
from extproc.batches import files as file_views
from extproc.batches import ids, lines, native, native_metering, record
from extproc.batches.files import OUTPUT_PURPOSE, PURPOSES, FileRecord
from extproc.batches.lines import LineRef, LineRequest
from extproc.batches.native import LineResult, NativeTarget
from extproc.batches.native_client import NativeClient
from extproc.batches.record import BatchRecord
from extproc.batches.s3_blobs import S3Blobs
from extproc.batches.store import SqliteBatchStore
from extproc.tasks import state as task_state
from extproc.tasks.board import TaskBoard
from extproc.tasks.state import StoredRequest, TaskRecord
from extproc.telemetry.metering import MeteringStore

log = logging.getLogger("modelyard.batches")
_T = TypeVar("_T")

_JSON = (("content-type", "application/json"),)
_ANTHROPIC = (("content-type", "application/json"), ("anthropic-version", "2023-06-01"))
# Picks where a batch runs whole at a provider's batch API, from the models its lines name (flows/batches.py).
NativePick = Callable[[set[str]], NativeTarget | None]


class BatchDesk:
    def __init__(self, cfg: BatchesConfig, board: TaskBoard, store: SqliteBatchStore | None = None, *,
                 config: GatewayConfig | None = None, metering: MeteringStore | None = None,
                 budgets: BudgetGuard | None = None, native_client: NativeClient | None = None) -> None:
        self.cfg = cfg
        self.board = board
        self.config = config  # the deployments native batches run on, their prices, the tenants' tiers
        self.metering = metering
        self.budgets = budgets  # a native batch's lines are spend of its tenant (and the key that made it)
        self.native_client = native_client or NativeClient()
        self.store = store or SqliteBatchStore(cfg.sqlite_path)
        # File bytes in an S3-compatible bucket when configured; their records stay in the store.
        self.blobs = S3Blobs(cfg.file_store) if cfg.file_store is not None else None
        self._finalizer: asyncio.Task[None] | None = None

    # -- files -----------------------------------------------------------------------------------
    async def upload(self, tenant: str, filename: str, purpose: str, data: bytes) -> FileRecord:
        if purpose not in PURPOSES:
            raise ClientError(f"purpose must be one of {', '.join(sorted(PURPOSES))}, not {purpose!r}")
        if len(data) > self.cfg.max_file_bytes:
            raise ClientError(f"the file is {len(data)} bytes; the gateway keeps files up to "
                              f"{self.cfg.max_file_bytes} bytes", status=413)
        rec = FileRecord(ids.new_file_id(), tenant, purpose, filename[:255] or "upload", len(data), time.time())
        if not await self._put(rec, data, self.cfg.max_files_per_tenant):
            raise ClientError(f"this tenant already holds {self.cfg.max_files_per_tenant} files; delete some first")
        return rec

    async def _put(self, rec: FileRecord, data: bytes, max_files: int | None = None) -> bool:
        """The bytes, then the record: a record never names bytes that were not stored."""
        if self.blobs is None:
            return await self._store(self.store.put_file(rec, data, max_files))
        key = self.blobs.key(rec.tenant, rec.id)
        await self.blobs.put(key, data)
        if await self._store(self.store.put_file(rec, b"", max_files)):
            return True
        await self.blobs.delete(key)  # refused (too many files): the bytes go too
        return False

    async def file(self, file_id: str, tenant: str) -> FileRecord:
        rec = await self._store(self.store.get_file(file_id, tenant))
        if rec is None:
            raise NotFound(f"No such File object: {file_id}")
        return rec

    async def file_content(self, file_id: str, tenant: str) -> bytes:
        data = await self._store(self.store.file_data(file_id, tenant))
        if data is None:
            raise NotFound(f"No such File object: {file_id}")
        if data or self.blobs is None:  # bytes in SQLite (also those stored before the bucket was configured)
            return data
        rec = await self.file(file_id, tenant)  # the tenant's own record first: only then its key
        if rec.bytes == 0:
            return b""
        try:
            return await self.blobs.get(self.blobs.key(tenant, file_id))
        except NotFound:
            log.error("file %s: its record is here but its object is not in the bucket", file_id)
            raise NotFound(f"No such File object: {file_id}") from None

    async def list_files(self, tenant: str, purpose: str | None, limit: int, after: str | None) -> dict[str, Any]:
        recs, more = await self._store(self.store.list_files(tenant, purpose, limit, after))
        return file_views.list_view(recs, more)

    async def delete_file(self, file_id: str, tenant: str) -> dict[str, Any]:
        if not await self._delete_file(file_id, tenant):
            raise NotFound(f"No such File object: {file_id}")
        return file_views.deleted_view(file_id)

    async def _delete_file(self, file_id: str, tenant: str) -> bool:
        """The record, then the bytes (an object left behind by a failed delete names no file)."""
        if not await self._store(self.store.delete_file(file_id, tenant)):
            return False
        if self.blobs is not None:
            try:
                await self.blobs.delete(self.blobs.key(tenant, file_id))
            except Unavailable:
                log.warning("file %s: deleted, but its object stays in the bucket", file_id)
        return True

    # -- batches ---------------------------------------------------------------------------------
    async def create_openai(self, tenant: str, input_file_id: str, endpoint: str, window: str,
                            metadata: dict[str, Any] | None, pick: NativePick | None = None,
                            key_id: str | None = None) -> BatchRecord:
        if window not in record.WINDOWS:
            raise ClientError(f"completion_window must be one of {', '.join(record.WINDOWS)}, not {window!r}")
        if endpoint not in lines.OPENAI_ENDPOINTS:
            raise ClientError(f"endpoint must be one of {', '.join(lines.OPENAI_ENDPOINTS)}, not {endpoint!r}")
        f = await self.file(input_file_id, tenant)
        if f.purpose != "batch":
            raise ClientError(f"file {input_file_id} has purpose {f.purpose!r}; a batch reads purpose 'batch' files")
        data = await self.file_content(input_file_id, tenant)
        batch_id = ids.new_batch_id("openai")
        reqs = await asyncio.to_thread(lines.parse_openai_input, data, batch_id, endpoint, self.cfg.max_lines)
        protocol = lines.OPENAI_ENDPOINTS[endpoint]
        target = self._native_target(reqs, pick) if endpoint == native.OPENAI_PATH else None
        if target is not None:
            return await self._start_native(batch_id, tenant, "openai", endpoint, reqs, target, window,
                                            input_file_id=input_file_id, metadata=metadata, key_id=key_id)
        return await self._start(batch_id, tenant, "openai", endpoint, protocol, reqs, _JSON, window,
                                 input_file_id=input_file_id, metadata=metadata)

    async def create_anthropic(self, tenant: str, doc: Any, pick: NativePick | None = None,
                               key_id: str | None = None) -> BatchRecord:
        batch_id = ids.new_batch_id("anthropic")
        reqs = lines.parse_anthropic_requests(doc, batch_id, self.cfg.max_lines)
        target = self._native_target(reqs, pick)
        if target is not None:
            return await self._start_native(batch_id, tenant, "anthropic", lines.ANTHROPIC_PATH, reqs, target, "24h",
                                            key_id=key_id)
        return await self._start(batch_id, tenant, "anthropic", lines.ANTHROPIC_PATH, "anthropic", reqs,
                                 _ANTHROPIC, "24h")

    # -- native batches: run whole at the provider's own batch API ---------------------------------
    def _native_target(self, reqs: list[LineRequest], pick: NativePick | None) -> NativeTarget | None:
        """Where the batch runs whole, when every line that runs names one model whose deployment
        says `batch: {mode: native}`; None: each line is replayed through the gateway."""
        if pick is None:
            return None
        models: set[str] = set()
        for r in reqs:
            if r.ref.task_id is not None:
                model = orjson.loads(r.body).get("model")
                models.add(model if isinstance(model, str) else "")
        target = pick(models) if len(models) == 1 else None
        dep = self._deployment(target.cluster, target.model) if target is not None else None
        if target is not None and dep is not None and dep.batch is not None:
            # Bedrock refuses a job of fewer records than its quota: a smaller batch is replayed.
            least = dep.batch.min_records or (100 if target.protocol == "bedrock" else 1)
            if sum(r.ref.task_id is not None for r in reqs) < least:
                return None
        return target

    async def _start_native(self, batch_id: str, tenant: str, api: record.Api, path: str, reqs: list[LineRequest],
                            target: NativeTarget, window: str, *, input_file_id: str | None = None,
                            metadata: dict[str, Any] | None = None, key_id: str | None = None) -> BatchRecord:
        """Each line rendered for the provider (a line that cannot be is refused, as a malformed one
        is), the provider's batch created, then the record naming it."""
        dep = self._deployment(target.cluster, target.model)
        if dep is None:
            raise Unavailable(f"deployment {target.cluster} is not configured", retry_after_s=1.0)
        refs: list[LineRef] = []
        bodies: list[tuple[int, dict[str, Any]]] = []
        for r in reqs:
            if r.ref.task_id is None:
                refs.append(r.ref)
                continue
            try:
                bodies.append((r.ref.index, native.render_line(api, target, r.body)))
                refs.append(r.ref)
            except (ModelyardError, orjson.JSONDecodeError) as e:
                message = e.message if isinstance(e, ModelyardError) else "the request body is not JSON"
                refs.append(LineRef(r.ref.index, r.ref.custom_id, None, "invalid_request", message))
        now = time.time()
        rec = BatchRecord(id=batch_id, tenant=tenant, api=api, endpoint=path, created_at=now,
                          expires_at=now + record.WINDOWS[window], lines=tuple(refs), input_file_id=input_file_id,
                          completion_window=window, metadata=metadata,
                          native={"model": target.model, "cluster": target.cluster, "protocol": target.protocol,
                                  "upstream_model": target.upstream_model, "upstream_id": None, "key_id": key_id})
        if bodies:
            payload: bytes | dict[str, Any] = native.anthropic_input(bodies) if target.protocol == "anthropic" \
                else native.bedrock_input(bodies) if target.protocol == "bedrock" \
                else native.vertex_input(bodies) if target.protocol == "vertex" else native.openai_input(bodies)
            try:
                upstream = await self.native_client.submit(dep, target.protocol, payload, batch_id)
            except ModelyardError as e:
                log.warning("batch %s: the provider's batch API refused it: %s", batch_id, e.message)
                raise Unavailable("the provider's batch API is unavailable; retry", retry_after_s=5.0) from None
            assert rec.native is not None
            rec = dataclasses.replace(rec, native={**rec.native, "upstream_id": upstream})
        await self._store(self.store.create_batch(rec))
        log.info("batch %s: %d lines at %s's own batch API (%d refused)", batch_id, len(reqs), target.cluster,
                 len(reqs) - len(bodies))
        if not bodies:
            rec = await self._finalize(rec, native.line_tasks(rec, {})) or rec
        return rec

    def _deployment(self, cluster: str, model: str) -> Deployment | None:
        """The model's own deployment on `cluster`: a cluster shared by models has one `batch:` per model."""
        if self.config is None:
            return None
        m = self.config.model(model)
        mine = [d for d in m.deployments if d.cluster == cluster] if m is not None else []
        return mine[0] if mine else self.config.clusters().get(cluster)

    async def _native_step(self, rec: BatchRecord) -> None:
        """One look at the provider's batch: cancel it when asked, bring its results back once it ended."""
        assert rec.native is not None
        n = rec.native
        dep = self._deployment(n["cluster"], n["model"])
        if dep is None or n.get("upstream_id") is None:
            log.warning("batch %s: deployment %s is no longer configured", rec.id, n["cluster"])
            return
        every = dep.batch.poll_every_s if dep.batch is not None else 5.0
        now = time.time()

        def claim(r: BatchRecord) -> BatchRecord | None:
            # One poll per interval among every finalizer (workers, replicas on one store), not one each.
            if not r.open or r.native is None or now - r.native.get("polled_at", 0.0) < every:
                return None
            return dataclasses.replace(r, native={**r.native, "polled_at": now})

        claimed = await self._store(self.store.update_batch(rec.id, claim))
        if claimed is None:
            return
        rec = claimed
        target = NativeTarget(n["model"], n["cluster"], n["protocol"], n["upstream_model"])
        client, upstream = self.native_client, n["upstream_id"]
        if rec.status == "cancelling" and not n.get("cancel_sent"):
            await client.cancel(dep, target.protocol, upstream)
            await self._store(self.store.update_batch(
                rec.id, lambda r: dataclasses.replace(r, native={**(r.native or {}), "cancel_sent": True})))
        doc = await client.status(dep, target.protocol, upstream)
        if not native.ended(target.protocol, doc):
            return
        out, err = await client.results(dep, target.protocol, upstream, doc)
        if target.protocol == "anthropic":
            results = await asyncio.to_thread(native.anthropic_results, rec.api, target, out)
        elif target.protocol == "vertex":
            results = await asyncio.to_thread(native.vertex_results, rec.api, target, out, str(doc.get("state")),
                                              [r.index for r in rec.lines if r.task_id is not None])
        elif target.protocol == "bedrock":
            results = await asyncio.to_thread(native.bedrock_results, rec.api, target, out, str(doc.get("status")),
                                              [r.index for r in rec.lines if r.task_id is not None])
        else:
            results = await asyncio.to_thread(native.openai_results, rec.api, target, out, err)
        done = await self._finalize(rec, native.line_tasks(rec, results))
        if done is not None:  # this finalizer closed it: its lines are metered once, here
            self._meter_native(done, target, dep, results)

    def _meter_native(self, rec: BatchRecord, target: NativeTarget, dep: Deployment,
                      results: dict[int, LineResult]) -> None:
        model = self.config.model(target.model) if self.config is not None else None
        if model is None or self.config is None:
            return
        tier = next((t.tier for t in self.config.tenants if t.name == rec.tenant), "-")
        native_metering.meter_lines(rec, dep, model, results, tier=tier, metering=self.metering, budgets=self.budgets)

    async def _start(self, batch_id: str, tenant: str, api: record.Api, path: str, protocol: str,
                     reqs: list[LineRequest], headers: tuple[tuple[str, str], ...], window: str, *,
                     input_file_id: str | None = None, metadata: dict[str, Any] | None = None) -> BatchRecord:
        now = time.time()
        tasks = [task_state.new_task(r.ref.task_id, tenant, protocol, StoredRequest("POST", path, headers, r.body), now)
                 for r in reqs if r.ref.task_id is not None]
        # The lines first, then the record: a crash between leaves lines nobody reads, never a
        # batch that names lines that were never stored.
        if tasks:
            await self.board.accept_many(tasks)
        rec = BatchRecord(id=batch_id, tenant=tenant, api=api, endpoint=path, created_at=now,
                          expires_at=now + record.WINDOWS[window], lines=tuple(r.ref for r in reqs),
                          input_file_id=input_file_id, completion_window=window, metadata=metadata)
        await self._store(self.store.create_batch(rec))
        log.info("batch %s: %d lines (%d refused)", batch_id, len(reqs), len(reqs) - len(tasks))
        if not tasks:  # every line refused: it ends now, with its error file
            rec = await self._finalize(rec) or rec
        return rec

    async def batch(self, batch_id: str, tenant: str, api: record.Api) -> tuple[BatchRecord, dict[str, int]]:
        """The tenant's batch of that API and its request counts; another tenant's is a 404."""
        rec = await self._store(self.store.get_batch(batch_id, tenant))
        if rec is None or rec.api != api:
            raise NotFound(f"No such batch: {batch_id}" if api == "openai" else f"No such message batch: {batch_id}")
        if not rec.open:
            return rec, rec.counts
        if rec.native is not None:  # the provider runs its lines: the poller brings them back
            return rec, record.counts(rec, native.line_tasks(rec, None))
        tasks = await self.board.read_many(rec.task_ids)
        if record.all_ended(rec, tasks):
            done = await self._finalize(rec, tasks)
            if done is not None:
                return done, done.counts
        return rec, record.counts(rec, tasks)

    async def list(self, tenant: str, api: record.Api, limit: int, after: str | None
                   ) -> tuple[list[tuple[BatchRecord, dict[str, int]]], bool]:
        recs, more = await self._store(self.store.list_batches(tenant, api, limit, after))
        out = []
        for rec in recs:
            if rec.open:
                out.append(await self.batch(rec.id, tenant, api))
            else:
                out.append((rec, rec.counts))
        return out, more

    async def cancel(self, batch_id: str, tenant: str, api: record.Api) -> tuple[BatchRecord, dict[str, int]]:
        rec, _ = await self.batch(batch_id, tenant, api)
        if rec.open:
            await self._store(self.store.update_batch(batch_id, lambda r: record.cancelling(r, time.time())))
            if rec.native is None:  # a native batch is cancelled at the provider by the poller
                await self._cancel_lines(rec)
        return await self.batch(batch_id, tenant, api)

    async def _cancel_lines(self, rec: BatchRecord) -> None:
        for task_id in rec.task_ids:
            try:
                await self.board.cancel_quietly(task_id)
            except Exception:  # the next finalizer pass reads what the store holds
                log.exception("batch %s: could not cancel line task %s", rec.id, task_id)

    async def delete(self, batch_id: str, tenant: str, api: record.Api) -> None:
        """An ended batch's record goes (Anthropic's delete); its results file with it."""
        rec, _ = await self.batch(batch_id, tenant, api)
        if rec.open:
            raise ClientError(f"batch {batch_id} is still in progress; cancel it, then delete it once it ended")
        await self._store(self.store.delete_batch(batch_id, tenant))
        if rec.results_file_id is not None:
            await self._delete_file(rec.results_file_id, tenant)

    async def results(self, batch_id: str, tenant: str) -> bytes:
        """Anthropic's results JSONL, once the batch ended."""
        rec, _ = await self.batch(batch_id, tenant, "anthropic")
        if rec.open or rec.results_file_id is None:
            raise ClientError(f"message batch {batch_id} is still in progress; its results are not ready",
                              status=404)
        return await self.file_content(rec.results_file_id, tenant)

    # -- the end of a batch ------------------------------------------------------------------------
    async def _finalize(self, rec: BatchRecord, tasks: dict[str, TaskRecord] | None = None) -> BatchRecord | None:
        """Every line ended: write its files, then close the record (another finalizer may have)."""
        if tasks is None:
            tasks = await self.board.read_many(rec.task_ids)
        now = time.time()
        final_counts = record.counts(rec, tasks)
        output_id = error_id = results_id = None
        if rec.api == "anthropic":
            body = await asyncio.to_thread(record.anthropic_results, rec, tasks)
            results_id = await self._result_file(rec, "results", f"{rec.id}_results.jsonl", body, now)
        else:
            out, err = await asyncio.to_thread(record.openai_files, rec, tasks)
            if out:
                output_id = await self._result_file(rec, "output", f"{rec.id}_output.jsonl", out, now)
            if err:
                error_id = await self._result_file(rec, "error", f"{rec.id}_error.jsonl", err, now)
        done = await self._store(self.store.update_batch(
            rec.id, lambda r: record.finish(r, now, output_id, error_id, results_id, final_counts)))
        if done is not None:
            log.info("batch %s: %s %s", rec.id, done.status, final_counts)
        return done

    async def _result_file(self, rec: BatchRecord, kind: str, name: str, data: bytes, now: float) -> str:
        f = FileRecord(ids.result_file_id(rec.id, kind), rec.tenant, OUTPUT_PURPOSE, name, len(data), now)
        await self._put(f, data)
        return f.id

    async def _pass(self) -> None:
        """One look at every open batch: expire what ran out of time, close what ended."""
        now = time.time()
        for batch_id in await self.store.open_batches():
            found = await self.store.read_batch(batch_id)
            if found is not None and found.native is not None:  # the provider keeps its own window
                try:
                    await self._native_step(found)
                except ModelyardError as e:  # the provider is away: ask again next pass
                    log.warning("batch %s: %s", batch_id, e.message)
                continue
            rec = await self.store.update_batch(batch_id, lambda r: record.expiring(r, now))
            if rec is not None:  # the window ended: lines still waiting never run
                log.warning("batch %s: completion window ended; cancelling the lines still open", batch_id)
                await self._cancel_lines(rec)
            rec = rec or await self.store.read_batch(batch_id)
            if rec is None or not rec.open:
                continue
            tasks = await self.board.read_many(rec.task_ids)
            if record.all_ended(rec, tasks):
                await self._finalize(rec, tasks)

    async def _loop(self) -> None:
        while True:
            try:
                await self._pass()
            except Exception:  # a store hiccup must not end the finalizer
                log.exception("batches: the finalizer pass failed; trying again")
            await asyncio.sleep(self.cfg.finalize_every_s)

    @staticmethod
    async def _store(work: Awaitable[_T]) -> _T:
        try:
            return await work
        except (ClientError, NotFound):
            raise
        except Exception as e:
            log.error("batch store: %s", type(e).__name__)
            raise Unavailable("the batch store is unavailable; retry", retry_after_s=1.0) from None

    # -- lifecycle --------------------------------------------------------------------------------
    def start(self) -> None:
        self._finalizer = asyncio.get_running_loop().create_task(self._loop(), name="batch-finalizer")

    async def close(self) -> None:
        if self._finalizer is not None:
            self._finalizer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._finalizer
        if self.blobs is not None:
            await self.blobs.close()
        await self.native_client.close()
        await self.store.close()
