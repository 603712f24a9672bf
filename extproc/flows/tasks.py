"""`GET /v1/tasks/{id}[?wait=N]` and `DELETE /v1/tasks/{id}`: a tenant's async tasks (docs/tasks.md).

Another tenant's task answers exactly like an unknown id (404), so ids cannot be probed.
"""

from __future__ import annotations

import math

from extproc import messages as msg
from extproc.context import RequestContext, json_response
from extproc.gateway import Gateway
from extproc.tasks import state
from extproc.tasks.board import TaskBoard
from modelyard.errors import ClientError, NotFound

PREFIX = "/v1/tasks/"


def task_id(path: str) -> str | None:
    rest = path[len(PREFIX):] if path.startswith(PREFIX) else ""
    return rest if rest and "/" not in rest else None


def _board(gw: Gateway, ctx: RequestContext) -> TaskBoard:
    if gw.tasks is None:
        raise NotFound(f"Unknown request URL: {ctx.method} {ctx.path}")
    return gw.tasks


def _wait_s(ctx: RequestContext) -> float:
    raw = ctx.query.get("wait")
    if raw is None:
        return 0.0
    try:
        wait = float(raw)
    except ValueError:
        wait = math.nan
    if not math.isfinite(wait) or wait < 0:
        raise ClientError("wait must be a number of seconds, 0 or more")
    return wait


async def get_task(gw: Gateway, ctx: RequestContext) -> msg.ProcessingResponse:
    assert ctx.tenant is not None
    rec = await _board(gw, ctx).lookup(task_id(ctx.path) or "", ctx.tenant.name, _wait_s(ctx))
    return json_response(200, state.public_view(rec), ctx)


async def cancel_task(gw: Gateway, ctx: RequestContext) -> msg.ProcessingResponse:
    assert ctx.tenant is not None
    rec = await _board(gw, ctx).cancel(task_id(ctx.path) or "", ctx.tenant.name)
    return json_response(200, state.public_view(rec), ctx)
