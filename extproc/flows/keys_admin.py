"""The admin API on the gateway's listener: `/admin/v1/keys...`, the same operations as
`modelyard keys` (docs/keys.md). The session checks the admin key before any of these run;
each call, refused or not, leaves one audit row (`key_admin`), never holding a secret.

    GET    /admin/v1/keys[?tenant=T]       list
    POST   /admin/v1/keys                  create: {"tenant", "name", "models", "budget_usd", "budget_period", "expires", "rpm", "tpm"}
    GET    /admin/v1/keys/{id}             one key
    POST   /admin/v1/keys/{id}/rotate      a new secret; the old one stops
    POST   /admin/v1/keys/{id}/revoke      (or DELETE /admin/v1/keys/{id})
    POST   /admin/v1/keys/{id}/update      narrow its models, set its budget: {"models", "budget_usd", "budget_period"}
    GET    /admin/v1/spend?by=key|tenant|model[&since=7d]   `modelyard spend` over this host's metering store
    GET    /admin/v1/cache                 the response cache's entries and bytes (`modelyard cache stats`)
    DELETE /admin/v1/cache[?tenant=T&model=M]   drop entries (`modelyard cache purge`)
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from budgets.report import BY, SpendRow, read_calls, spend_report
from contracts.errors import ClientError, ModelyardError, NotFound, Unavailable
from contracts.when import parse_when
from extproc import messages as msg
from extproc.cache.report import stats_view
from extproc.context import RequestContext, json_object, json_response
from extproc.flows.body_answer import SelfAnswered
from extproc.gateway import Gateway
from extproc.key_admin import KeyAdmin
from keys.db import StoreError, redacted
from keys.spec import KeySpecError, change_from_json, spec_from_json
from keys.store import RevokedKey, UnknownKey

PREFIX = "/admin/v1/keys"
SPEND = "/admin/v1/spend"
CACHE = "/admin/v1/cache"


def parse_path(method: str, path: str) -> tuple[str, str] | None:
    """(operation, key id) for an admin path, or None when the path is not the admin API's."""
    if path == SPEND:
        return ("spend", "") if method == "GET" else ("bad_method", "")
    if path == CACHE:
        return ("cache_stats", "") if method == "GET" else ("cache_purge", "") if method == "DELETE" \
            else ("bad_method", "")
    if path == PREFIX or path == PREFIX + "/":
        return ("list", "") if method == "GET" else ("create", "") if method == "POST" else ("bad_method", "")
    if not path.startswith(PREFIX + "/"):
        return None
    parts = path[len(PREFIX) + 1:].split("/")
    if len(parts) == 1 and parts[0]:
        return ("get", parts[0]) if method == "GET" else ("revoke", parts[0]) if method == "DELETE" \
            else ("bad_method", parts[0])
    if len(parts) == 2 and parts[0] and parts[1] in ("rotate", "revoke", "update"):
        return (parts[1], parts[0]) if method == "POST" else ("bad_method", parts[0])
    return ("unknown", "")


def _admin(gw: Gateway, ctx: RequestContext) -> KeyAdmin:
    if gw.key_admin is None:
        raise NotFound(f"Unknown request URL: {ctx.method} {ctx.path}")
    return gw.key_admin


async def _audited(gw: Gateway, ctx: RequestContext, op: str, key_id: str,
                   work: Callable[[KeyAdmin], Awaitable[tuple[int, Any, str]]]) -> msg.ProcessingResponse:
    status, payload = await run_audited(gw, ctx, op, key_id, work)
    return json_response(status, payload, ctx)


async def run_audited(gw: Gateway, ctx: RequestContext, op: str, key_id: str,
                      work: Callable[[KeyAdmin], Awaitable[tuple[int, Any, str]]]) -> tuple[int, Any]:
    """Run one operation and audit it, whatever it came to (refusals with their reason): the admin
    API's and the console's one path (`extproc/flows/console.py`)."""
    admin = _admin(gw, ctx)
    try:
        status, payload, tenant = await work(admin)
    except ModelyardError as e:
        admin.audited(ctx, op, e.status, key_id=key_id, reason=e.message)
        raise
    except KeySpecError as e:
        admin.audited(ctx, op, 400, key_id=key_id, reason=str(e))
        raise ClientError(str(e)) from None
    except UnknownKey as e:
        admin.audited(ctx, op, 404, key_id=key_id, reason=e.args[0])
        raise NotFound(e.args[0]) from None
    except RevokedKey as e:
        admin.audited(ctx, op, 409, key_id=key_id, reason=str(e))
        raise ClientError(str(e), status=409) from None
    except StoreError as e:
        admin.audited(ctx, op, 503, key_id=key_id, reason=redacted(str(e)))
        raise Unavailable("the key store cannot be reached; retry shortly", retry_after_s=1) from None
    admin.audited(ctx, op, status, key_id=payload.get("id", key_id) if isinstance(payload, dict) else key_id,
                  tenant=tenant)
    return status, payload


async def answer(gw: Gateway, ctx: RequestContext) -> msg.ProcessingResponse:
    """Every admin operation without a body: list, get, rotate, revoke."""
    found = parse_path(ctx.method, ctx.path) or ("unknown", "")
    op, key_id = found

    async def work(admin: KeyAdmin) -> tuple[int, Any, str]:
        if op == "list":
            recs = await admin.list(ctx.query.get("tenant"))
            return 200, {"object": "list", "data": [r.view() for r in recs]}, ctx.query.get("tenant", "-")
        if op == "get":
            rec = await admin.get(key_id)
            return 200, rec.view(), rec.tenant
        if op == "rotate":
            rec, secret = await admin.rotate(key_id)
            return 200, {**rec.view(), "key": secret}, rec.tenant
        if op == "revoke":
            rec = await admin.revoke(key_id)
            return 200, rec.view(), rec.tenant
        if op == "spend":
            return 200, {"object": "list", "data": await _spend(gw, ctx)}, "-"
        if op in ("cache_stats", "cache_purge"):
            if gw.response_cache is None:
                raise NotFound("no model has a response cache policy")
            store = gw.response_cache.store
            if op == "cache_stats":
                return 200, stats_view(await store.stats()), "-"
            tenant, model = ctx.query.get("tenant"), ctx.query.get("model")
            return 200, {"purged": await store.purge(tenant, model)}, tenant or "-"
        if op == "bad_method":
            raise ClientError(f"{ctx.method} is not allowed on {ctx.path}", status=405)
        raise NotFound(f"Unknown request URL: {ctx.method} {ctx.path}")

    return await _audited(gw, ctx, op, key_id, work)


async def _spend(gw: Gateway, ctx: RequestContext) -> list[dict[str, object]]:
    return [r.as_dict() for r in await spend_rows(gw, ctx.query)]


async def spend_rows(gw: Gateway, query: dict[str, str]) -> list[SpendRow]:
    """`modelyard spend` over this host's metering store, by `by` since `since` (the admin API's and the
    console's one reading)."""
    by = query.get("by", "tenant")
    if by not in BY:
        raise ClientError(f"by must be one of {', '.join(BY)}, not {by!r}")
    try:
        since = parse_when(query["since"]) if query.get("since") else None
    except ValueError:
        raise ClientError(f"since {query['since']!r}: expected 7d, 12h, 30m or an ISO date") from None
    db = gw.config.extproc.metering_db
    if not db:
        raise NotFound("spend needs extproc.metering_db: this gateway meters nothing")
    # A read of the whole period's rows: in a thread, never on the event loop.
    return await asyncio.to_thread(lambda: spend_report(read_calls([db], since), by, since))


class CreateKeyFlow(SelfAnswered):
    """`POST /admin/v1/keys`: the one admin call with a body."""

    async def request_body(self, body: bytes) -> msg.ProcessingResponse:
        async def work(admin: KeyAdmin) -> tuple[int, Any, str]:
            doc = json_object(body, '{"tenant": ..., ...}')
            spec = spec_from_json(admin.config, doc)
            rec, secret = await admin.create(spec)
            return 201, {**rec.view(), "key": secret}, rec.tenant

        return await _audited(self.gw, self.ctx, "create", "", work)


class UpdateKeyFlow(SelfAnswered):
    """`POST /admin/v1/keys/{id}/update`: narrow a key's models, set its budget (the checks of create)."""

    async def request_body(self, body: bytes) -> msg.ProcessingResponse:
        key_id = (parse_path(self.ctx.method, self.ctx.path) or ("", ""))[1]

        async def work(admin: KeyAdmin) -> tuple[int, Any, str]:
            doc = json_object(body, '{"models": [...], "budget_usd": ..., "budget_period": ...}')
            return await update_key(admin, key_id, doc)

        return await _audited(self.gw, self.ctx, "update", key_id, work)


async def update_key(admin: KeyAdmin, key_id: str, doc: dict[str, Any]) -> tuple[int, Any, str]:
    """The update's work (the admin API's and the console's): the key's tenant checks the models."""
    rec = await admin.get(key_id)
    rec = await admin.update(key_id, change_from_json(admin.config, rec.tenant, doc))
    return 200, rec.view(), rec.tenant
