"""The demo providers' own batch APIs, as they document them: OpenAI's Files + Batches on the demo
OpenAI server (`POST /v1/files`, `GET /v1/files/{id}/content`, `POST /v1/batches`, `GET
/v1/batches/{id}`, `POST /v1/batches/{id}/cancel`) and Anthropic's Message Batches on the demo
Anthropic server (`POST /v1/messages/batches`, `GET .../{id}`, `POST .../{id}/cancel`,
`GET .../{id}/results`). In memory; a batch ends `BATCH_SECONDS` after it was created, each request
answered as the demo's synchronous endpoint would (devstack.demo.behaviour), or ends cancelled; a
`demo-hold-MS` in a request holds its whole batch open that much longer.
"""

from __future__ import annotations

import hmac
import os
import time
from types import ModuleType
from typing import Any

import orjson
from aiohttp import web

from contracts.errors import ModelyardError
from devstack.demo.behaviour import demo_reply
from devstack.demo.faults import hold_seconds

BATCH_SECONDS = float(os.environ.get("MODELYARD_DEMO_BATCH_SECONDS", "2.0"))


class _Store:
    def __init__(self, adapter: ModuleType, prefix: str, require_key: str | None) -> None:
        self.adapter = adapter
        self.prefix = prefix
        self.require_key = require_key
        self.files: dict[str, bytes] = {}
        self.batches: dict[str, dict[str, Any]] = {}
        self.inputs: dict[str, list[tuple[str, bytes]]] = {}  # batch id -> (custom_id, request body)
        self.answered = 0

    def refused(self, request: web.Request) -> web.Response | None:
        if self.require_key is None:
            return None
        got = self.adapter.client_api_key(request.headers, request.query)
        if got is None or not hmac.compare_digest(got.encode(), self.require_key.encode()):
            return web.Response(status=401, body=self.adapter.render_error(401, "invalid upstream API key",
                                                                           "authentication_error"),
                                content_type="application/json")
        return None

    def answer(self, body: bytes) -> tuple[int, bytes]:
        """One request, as the synchronous endpoint answers it."""
        self.answered += 1
        try:
            req = self.adapter.parse_request(body)
        except ModelyardError as e:
            return e.status, self.adapter.render_error(e.status, e.message, e.type)
        resp = demo_reply(req, self.prefix, response_id=f"{self.prefix.strip('[]')}-batch-{self.answered}")
        return 200, self.adapter.render_response(resp, model=req.model, request=req)

    def due(self, batch: dict[str, Any]) -> bool:
        return time.time() >= batch["_ends_at"] or batch["_cancel"]


def _public(batch: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in batch.items() if not k.startswith("_")}


def add_openai_batch_routes(app: web.Application, adapter: ModuleType, prefix: str, require_key: str | None) -> None:
    store = _Store(adapter, prefix, require_key)

    def error(status: int, message: str) -> web.Response:
        return web.Response(status=status, body=adapter.render_error(status, message, None),
                            content_type="application/json")

    async def upload(request: web.Request) -> web.Response:
        if (no := store.refused(request)) is not None:
            return no
        form = await request.post()
        f = form.get("file")
        if form.get("purpose") != "batch" or not isinstance(f, web.FileField):
            return error(400, "purpose batch and a file are required")
        data = f.file.read()
        file_id = f"file-demo{len(store.files) + 1}"
        store.files[file_id] = data
        return web.json_response({"id": file_id, "object": "file", "bytes": len(data), "created_at": int(time.time()),
                                  "filename": f.filename, "purpose": "batch"})

    async def content(request: web.Request) -> web.Response:
        if (no := store.refused(request)) is not None:
            return no
        data = store.files.get(request.match_info["id"])
        return error(404, "No such File object") if data is None else web.Response(body=data)

    async def create(request: web.Request) -> web.Response:
        if (no := store.refused(request)) is not None:
            return no
        doc = await request.json()
        data = store.files.get(doc.get("input_file_id", ""))
        if data is None or doc.get("endpoint") != "/v1/chat/completions" or doc.get("completion_window") != "24h":
            return error(400, "input_file_id, endpoint /v1/chat/completions and completion_window 24h are required")
        lines = [orjson.loads(x) for x in data.splitlines() if x.strip()]
        batch_id = f"batch_demo{len(store.batches) + 1}"
        now = int(time.time())
        store.inputs[batch_id] = [(ln["custom_id"], orjson.dumps(ln["body"])) for ln in lines]
        store.batches[batch_id] = {
            "id": batch_id, "object": "batch", "endpoint": doc["endpoint"], "input_file_id": doc["input_file_id"],
            "completion_window": "24h", "status": "in_progress", "created_at": now, "output_file_id": None,
            "error_file_id": None, "request_counts": {"total": len(lines), "completed": 0, "failed": 0},
            "metadata": doc.get("metadata"), "_cancel": False,
            "_ends_at": time.time() + BATCH_SECONDS + hold_seconds(data.decode("utf-8", "replace"))}
        return web.json_response(_public(store.batches[batch_id]))

    def settle(batch: dict[str, Any]) -> None:
        if batch["status"] not in ("in_progress", "cancelling") or not store.due(batch):
            return
        out: list[dict[str, Any]] = []
        err: list[dict[str, Any]] = []
        for n, (cid, body) in enumerate(store.inputs[batch["id"]]):
            if batch["_cancel"]:
                err.append({"id": f"req_{n}", "custom_id": cid, "response": None,
                            "error": {"code": "batch_cancelled", "message": "cancelled"}})
                continue
            status, answer = store.answer(body)
            row = {"id": f"req_{n}", "custom_id": cid, "error": None,
                   "response": {"status_code": status, "request_id": f"req_{n}", "body": orjson.loads(answer)}}
            (out if status == 200 else err).append(row)
        for kind, rows in (("output", out), ("error", err)):
            if rows:
                file_id = f"file-{batch['id']}-{kind}"
                store.files[file_id] = b"".join(orjson.dumps(r) + b"\n" for r in rows)
                batch[f"{kind}_file_id"] = file_id
        batch["status"] = "cancelled" if batch["_cancel"] else "completed"
        batch["request_counts"] = {"total": len(out) + len(err), "completed": len(out), "failed": len(err)}

    async def retrieve(request: web.Request) -> web.Response:
        if (no := store.refused(request)) is not None:
            return no
        batch = store.batches.get(request.match_info["id"])
        if batch is None:
            return error(404, "No such batch")
        settle(batch)
        return web.json_response(_public(batch))

    async def cancel(request: web.Request) -> web.Response:
        if (no := store.refused(request)) is not None:
            return no
        batch = store.batches.get(request.match_info["id"])
        if batch is None:
            return error(404, "No such batch")
        if batch["status"] == "in_progress":
            batch["_cancel"], batch["status"] = True, "cancelling"
        return web.json_response(_public(batch))

    app.router.add_post("/v1/files", upload)
    app.router.add_get("/v1/files/{id}/content", content)
    app.router.add_post("/v1/batches", create)
    app.router.add_get("/v1/batches/{id}", retrieve)
    app.router.add_post("/v1/batches/{id}/cancel", cancel)


def add_anthropic_batch_routes(app: web.Application, adapter: ModuleType, prefix: str,
                               require_key: str | None) -> None:
    store = _Store(adapter, prefix, require_key)

    def error(status: int, message: str) -> web.Response:
        return web.Response(status=status, body=adapter.render_error(status, message, None),
                            content_type="application/json")

    def iso(t: float) -> str:
        return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t))

    async def create(request: web.Request) -> web.Response:
        if (no := store.refused(request)) is not None:
            return no
        doc = await request.json()
        reqs = doc.get("requests") if isinstance(doc, dict) else None
        if not isinstance(reqs, list) or not reqs:
            return error(400, "requests: a non-empty array is required")
        batch_id = f"msgbatch_demo{len(store.batches) + 1}"
        now = time.time()
        store.inputs[batch_id] = [(r["custom_id"], orjson.dumps(r["params"])) for r in reqs]
        store.batches[batch_id] = {
            "id": batch_id, "type": "message_batch", "processing_status": "in_progress",
            "request_counts": {"processing": len(reqs), "succeeded": 0, "errored": 0, "canceled": 0, "expired": 0},
            "created_at": iso(now), "ended_at": None, "results_url": None, "_cancel": False, "_results": b"",
            "_ends_at": now + BATCH_SECONDS + max(hold_seconds(b.decode("utf-8", "replace"))
                                                  for _, b in store.inputs[batch_id])}
        return web.json_response(_public(store.batches[batch_id]))

    def settle(batch: dict[str, Any], host: str) -> None:
        if batch["processing_status"] == "ended" or not store.due(batch):
            return
        rows: list[dict[str, Any]] = []
        counts = {"processing": 0, "succeeded": 0, "errored": 0, "canceled": 0, "expired": 0}
        for cid, body in store.inputs[batch["id"]]:
            if batch["_cancel"]:
                rows.append({"custom_id": cid, "result": {"type": "canceled"}})
                counts["canceled"] += 1
                continue
            status, answer = store.answer(body)
            result = {"type": "succeeded", "message": orjson.loads(answer)} if status == 200 \
                else {"type": "errored", "error": orjson.loads(answer)}
            counts["succeeded" if status == 200 else "errored"] += 1
            rows.append({"custom_id": cid, "result": result})
        batch.update(processing_status="ended", request_counts=counts, ended_at=iso(time.time()),
                     results_url=f"http://{host}/v1/messages/batches/{batch['id']}/results",
                     _results=b"".join(orjson.dumps(r) + b"\n" for r in rows))

    async def retrieve(request: web.Request) -> web.Response:
        if (no := store.refused(request)) is not None:
            return no
        batch = store.batches.get(request.match_info["id"])
        if batch is None:
            return error(404, "No such message batch")
        settle(batch, request.host)
        return web.json_response(_public(batch))

    async def cancel(request: web.Request) -> web.Response:
        if (no := store.refused(request)) is not None:
            return no
        batch = store.batches.get(request.match_info["id"])
        if batch is None:
            return error(404, "No such message batch")
        if batch["processing_status"] == "in_progress":
            batch["_cancel"], batch["processing_status"] = True, "canceling"
        return web.json_response(_public(batch))

    async def results(request: web.Request) -> web.Response:
        if (no := store.refused(request)) is not None:
            return no
        batch = store.batches.get(request.match_info["id"])
        if batch is None or batch["processing_status"] != "ended":
            return error(404, "No results for this message batch yet")
        return web.Response(body=batch["_results"], content_type="application/binary")

    app.router.add_post("/v1/messages/batches", create)
    app.router.add_get("/v1/messages/batches/{id}", retrieve)
    app.router.add_post("/v1/messages/batches/{id}/cancel", cancel)
    app.router.add_get("/v1/messages/batches/{id}/results", results)
