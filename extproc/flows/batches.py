"""OpenAI Files and Batches, Anthropic Message Batches: thin shells over `Gateway.batches`
(extproc/batches/desk.py; docs/batches.md). Another tenant's file or batch answers 404, exactly
like an unknown id.

    POST /v1/files (multipart: file, purpose)     GET /v1/files[?purpose&limit&after]
    GET|DELETE /v1/files/{id}                     GET /v1/files/{id}/content
    POST /v1/batches                              GET /v1/batches[?limit&after]
    GET /v1/batches/{id}                          POST /v1/batches/{id}/cancel
    POST /v1/messages/batches                     GET /v1/messages/batches[?limit&after_id]
    GET /v1/messages/batches/{id}                 POST /v1/messages/batches/{id}/cancel
    GET /v1/messages/batches/{id}/results         DELETE /v1/messages/batches/{id} (once ended)
"""

from __future__ import annotations

from adapters.multipart import MultipartLimits, parse_multipart
from contracts.errors import ClientError, NotFound
from extproc import messages as msg
from extproc.batches import record
from extproc.batches.desk import BatchDesk, NativePick
from extproc.batches.files import file_view
from extproc.batches.native import NativeTarget
from extproc.batches.native import bedrock_native as native_bedrock
from extproc.context import RequestContext, json_object, json_response
from extproc.gateway import Gateway

FILES = "/v1/files"
BATCHES = "/v1/batches"
MESSAGE_BATCHES = "/v1/messages/batches"
# (collection, method, suffix after the id or None for the collection itself) -> operation
_OPS = {
    (FILES, "POST", None): "upload", (FILES, "GET", None): "list_files", (FILES, "GET", ""): "get_file",
    (FILES, "DELETE", ""): "delete_file", (FILES, "GET", "content"): "file_content",
    (BATCHES, "POST", None): "create_batch", (BATCHES, "GET", None): "list_batches", (BATCHES, "GET", ""): "get_batch",
    (BATCHES, "POST", "cancel"): "cancel_batch",
    (MESSAGE_BATCHES, "POST", None): "create_message_batch", (MESSAGE_BATCHES, "GET", None): "list_message_batches",
    (MESSAGE_BATCHES, "GET", ""): "get_message_batch", (MESSAGE_BATCHES, "POST", "cancel"): "cancel_message_batch",
    (MESSAGE_BATCHES, "GET", "results"): "message_batch_results",
    (MESSAGE_BATCHES, "DELETE", ""): "delete_message_batch",
}
BODY_OPS = frozenset({"upload", "create_batch", "create_message_batch"})


def parse_path(method: str, path: str) -> tuple[str, str] | None:
    """(operation, id) for a files/batches path; ("bad_method", "") for a known path with another
    method; None for a path that is not one of these."""
    for base in (MESSAGE_BATCHES, FILES, BATCHES):
        if path == base or path == base + "/":
            rest: list[str] = []
        elif path.startswith(base + "/"):
            rest = path[len(base) + 1:].split("/")
        else:
            continue
        if len(rest) > 2 or any(not p for p in rest):
            return None
        suffix = None if not rest else (rest[1] if len(rest) == 2 else "")
        op = _OPS.get((base, method, suffix))
        if op is None:
            known = any(k[0] == base and k[2] == suffix for k in _OPS)
            return ("bad_method", "") if known else None
        return op, rest[0] if rest else ""
    return None


def _desk(gw: Gateway, ctx: RequestContext) -> BatchDesk:
    if gw.batches is None:
        raise NotFound(f"Unknown request URL: {ctx.method} {ctx.path}")
    return gw.batches


def _tenant(ctx: RequestContext) -> str:
    assert ctx.tenant is not None
    return ctx.tenant.name


def _limit(ctx: RequestContext, default: int, most: int) -> int:
    raw = ctx.query.get("limit")
    if raw is None:
        return default
    try:
        n = int(raw)
    except ValueError:
        n = 0
    if not 1 <= n <= most:
        raise ClientError(f"limit must be a whole number from 1 to {most}")
    return n



def _results_url(ctx: RequestContext, batch_id: str) -> str:
    """Absolute, as Anthropic gives it: the SDK fetches it as is, so it names this gateway."""
    host = ctx.headers.get(":authority") or ctx.headers.get("host") or "localhost"
    scheme = ctx.headers.get("x-forwarded-proto") or ctx.headers.get(":scheme") or "http"
    return f"{scheme}://{host}{MESSAGE_BATCHES}/{batch_id}/results"


def _key_id(ctx: RequestContext) -> str | None:
    return ctx.caller.key_id if ctx.caller is not None else None


def _native_pick(gw: Gateway, ctx: RequestContext) -> NativePick:
    """A batch whose lines all name one model the tenant may use, with a deployment that says
    `batch: {mode: native}`, runs whole at that deployment's own batch API."""
    tenant = ctx.tenant
    assert tenant is not None

    def pick(models: set[str]) -> NativeTarget | None:
        (name,) = models
        model = gw.config.model(name)
        if model is None or not tenant.may_use(name):
            return None
        for dep in model.deployments:
            if dep.batch is None or dep.batch.mode != "native":
                continue
            upstream = dep.upstream_model or model.name
            if dep.protocol in ("openai", "anthropic"):
                return NativeTarget(model.name, dep.cluster, "anthropic" if dep.protocol == "anthropic" else "openai",
                                    upstream)
            if dep.protocol == "bedrock" and dep.upstream_model and native_bedrock(upstream):
                return NativeTarget(model.name, dep.cluster, "bedrock", upstream)
            if dep.protocol == "vertex":  # Gemini (the config refuses other publishers' native batches)
                return NativeTarget(model.name, dep.cluster, "vertex", upstream)
        return None

    return pick


# -- bodies -------------------------------------------------------------------------------------------
async def upload(gw: Gateway, ctx: RequestContext, body: bytes) -> msg.ProcessingResponse:
    desk = _desk(gw, ctx)
    limits = MultipartLimits(max_body_bytes=max(desk.cfg.max_file_bytes, gw.config.extproc.max_body_bytes),
                             max_parts=16)
    parts = parse_multipart(body, ctx.headers.get("content-type"), limits)
    file = next((p for p in parts if p.name == "file"), None)
    purpose = next((p for p in parts if p.name == "purpose"), None)
    if file is None:
        raise ClientError("a multipart part named `file` is required")
    if purpose is None:
        raise ClientError("a multipart field named `purpose` is required")
    rec = await desk.upload(_tenant(ctx), file.filename or "upload", purpose.data.decode("utf-8", "replace").strip(),
                            file.data)
    return json_response(200, file_view(rec), ctx)


async def create_batch(gw: Gateway, ctx: RequestContext, body: bytes) -> msg.ProcessingResponse:
    doc = json_object(body)
    file_id, endpoint = doc.get("input_file_id"), doc.get("endpoint")
    window, metadata = doc.get("completion_window", "24h"), doc.get("metadata")
    if not isinstance(file_id, str) or not file_id:
        raise ClientError("input_file_id is required")
    if not isinstance(endpoint, str):
        raise ClientError("endpoint is required")
    if not isinstance(window, str):
        raise ClientError("completion_window must be a string")
    if metadata is not None and (not isinstance(metadata, dict) or len(metadata) > 16
                                 or not all(isinstance(v, str) for v in metadata.values())):
        raise ClientError("metadata: at most 16 string values")
    desk = _desk(gw, ctx)
    rec = await desk.create_openai(_tenant(ctx), file_id, endpoint, window, metadata, _native_pick(gw, ctx),
                                   _key_id(ctx))
    rec, counts = await desk.batch(rec.id, rec.tenant, "openai")
    return json_response(200, record.openai_view(rec, counts), ctx)


async def create_message_batch(gw: Gateway, ctx: RequestContext, body: bytes) -> msg.ProcessingResponse:
    doc = json_object(body)
    desk = _desk(gw, ctx)
    rec = await desk.create_anthropic(_tenant(ctx), doc, _native_pick(gw, ctx), _key_id(ctx))
    rec, counts = await desk.batch(rec.id, rec.tenant, "anthropic")
    return json_response(200, record.anthropic_view(rec, counts, _results_url(ctx, rec.id)), ctx)


BODY_HANDLERS = {"upload": upload, "create_batch": create_batch, "create_message_batch": create_message_batch}


# -- answers without a body --------------------------------------------------------------------------
async def answer(gw: Gateway, ctx: RequestContext) -> msg.ProcessingResponse:
    op, item = parse_path(ctx.method, ctx.path) or ("unknown", "")
    desk, tenant = _desk(gw, ctx), _tenant(ctx)
    if op == "list_files":
        return json_response(200, await desk.list_files(tenant, ctx.query.get("purpose"),
                                                        _limit(ctx, 10000, 10000), ctx.query.get("after")), ctx)
    if op == "get_file":
        return json_response(200, file_view(await desk.file(item, tenant)), ctx)
    if op == "delete_file":
        return json_response(200, await desk.delete_file(item, tenant), ctx)
    if op == "file_content":
        content = await desk.file_content(item, tenant)
        return msg.immediate(200, content, [("content-type", "application/octet-stream"), *ctx.task_headers()])
    if op == "get_batch":
        return json_response(200, record.openai_view(*await desk.batch(item, tenant, "openai")), ctx)
    if op == "cancel_batch":
        return json_response(200, record.openai_view(*await desk.cancel(item, tenant, "openai")), ctx)
    if op == "list_batches":
        found, more = await desk.list(tenant, "openai", _limit(ctx, 20, 100), ctx.query.get("after"))
        data = [record.openai_view(r, c) for r, c in found]
        return json_response(200, {"object": "list", "data": data, "first_id": data[0]["id"] if data else None,
                                   "last_id": data[-1]["id"] if data else None, "has_more": more}, ctx)
    if op == "get_message_batch":
        rec, counts = await desk.batch(item, tenant, "anthropic")
        return json_response(200, record.anthropic_view(rec, counts, _results_url(ctx, rec.id)), ctx)
    if op == "cancel_message_batch":
        rec, counts = await desk.cancel(item, tenant, "anthropic")
        return json_response(200, record.anthropic_view(rec, counts, _results_url(ctx, rec.id)), ctx)
    if op == "list_message_batches":
        found, more = await desk.list(tenant, "anthropic", _limit(ctx, 20, 1000), ctx.query.get("after_id"))
        data = [record.anthropic_view(r, c, _results_url(ctx, r.id)) for r, c in found]
        return json_response(200, {"data": data, "has_more": more, "first_id": data[0]["id"] if data else None,
                                   "last_id": data[-1]["id"] if data else None}, ctx)
    if op == "delete_message_batch":
        await desk.delete(item, tenant, "anthropic")
        return json_response(200, {"id": item, "type": "message_batch_deleted"}, ctx)
    if op == "message_batch_results":
        results = await desk.results(item, tenant)
        return msg.immediate(200, results, [("content-type", "application/binary"), *ctx.task_headers()])
    if op == "bad_method":
        raise ClientError(f"{ctx.method} is not allowed on {ctx.path}", status=405)
    raise NotFound(f"Unknown request URL: {ctx.method} {ctx.path}")
