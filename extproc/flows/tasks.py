"""`GET /v1/tasks/{id}[?wait=N]` and `DELETE /v1/tasks/{id}`: a tenant's async tasks (docs/tasks.md).

Another tenant's task answers exactly like an unknown id (404), so ids cannot be probed.
"""

from __future__ import annotations

import functools
import math

from contracts.envoy_names import WAIT_MARGIN_S
from contracts.errors import ClientError, NotFound
from extproc import messages as msg
from extproc.context import Interim, RequestContext, json_response
from extproc.gateway import Gateway
from extproc.tasks import state
from extproc.tasks.board import TaskBoard

PREFIX = "/v1/tasks/"
RESULT_SUFFIX = "/result"


def task_id(path: str) -> str | None:
    rest = path[len(PREFIX):] if path.startswith(PREFIX) else ""
    return rest if rest and "/" not in rest else None


def result_task_id(path: str) -> str | None:
    """The id in `/v1/tasks/{id}/result`: the stored answer's exact bytes and headers."""
    if not path.endswith(RESULT_SUFFIX):
        return None
    return task_id(path[: -len(RESULT_SUFFIX)])


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


async def get_task(gw: Gateway, ctx: RequestContext) -> msg.ProcessingResponse | Interim:
    assert ctx.tenant is not None
    board = _board(gw, ctx)
    wait = min(_wait_s(ctx), board.cfg.max_wait_s)
    tid = task_id(ctx.path) or ""
    rec = await board.lookup(tid, ctx.tenant.name)  # unknown, or another tenant's: 404 at once
    if rec.final or wait <= 0:
        return json_response(200, state.public_view(rec), ctx)
    # Envoy times each ext_proc message out: ask for the whole wait first, then wait.
    return Interim(msg.extend_timeout(wait + WAIT_MARGIN_S), functools.partial(_long_poll, board, ctx, tid, wait))


async def _long_poll(board: TaskBoard, ctx: RequestContext, tid: str, wait: float) -> msg.ProcessingResponse:
    assert ctx.tenant is not None
    rec = await board.lookup(tid, ctx.tenant.name, wait)
    return json_response(200, state.public_view(rec), ctx)


async def get_result(gw: Gateway, ctx: RequestContext) -> msg.ProcessingResponse:
    """The answer exactly as the synchronous call gave it (binary KServe tensors included)."""
    assert ctx.tenant is not None
    tid = result_task_id(ctx.path) or ""
    rec = await _board(gw, ctx).lookup(tid, ctx.tenant.name)
    if rec.status != "succeeded" or rec.result is None:
        raise NotFound(f"task {tid} has no result (status: {rec.status})")
    headers = rec.result_headers or (("content-type", "application/json"),)
    return msg.immediate(200, rec.result, [*headers, *ctx.task_headers()])


async def cancel_task(gw: Gateway, ctx: RequestContext) -> msg.ProcessingResponse:
    assert ctx.tenant is not None
    rec = await _board(gw, ctx).cancel(task_id(ctx.path) or "", ctx.tenant.name)
    return json_response(200, state.public_view(rec), ctx)
