"""Answers from config, without an upstream: model lists, KServe health and model metadata."""

from __future__ import annotations

from typing import Any

from adapters import kserve
from extproc import messages as msg
from extproc.config import ModelConfig
from extproc.context import RequestContext, json_response
from extproc.gateway import Gateway
from modelyard.errors import NotFound


def _model_card(m: ModelConfig) -> dict[str, Any]:
    return {"id": m.name, "object": "model", "created": 0, "owned_by": m.owned_by,
            "task_types": list(m.task_types)}


def list_models(gw: Gateway, ctx: RequestContext) -> msg.ProcessingResponse:
    assert ctx.tenant is not None
    return json_response(200, {"object": "list", "data": [_model_card(m) for m in gw.catalog.visible(ctx.tenant)]},
                         ctx)


def get_model(gw: Gateway, ctx: RequestContext) -> msg.ProcessingResponse:
    return json_response(200, _model_card(gw.catalog.model_for(ctx.tenant, ctx.path_model or "")), ctx)


def v2_health(gw: Gateway, ctx: RequestContext) -> msg.ProcessingResponse:
    return json_response(200, {"ready": True, "live": True}, ctx)


def v2_model_metadata(gw: Gateway, ctx: RequestContext) -> msg.ProcessingResponse:
    model = gw.catalog.model_for(ctx.tenant, ctx.path_model or "")
    return msg.immediate(200, kserve.render_model_metadata(model),
                         [("content-type", "application/json"), *ctx.task_headers()])


def not_found(gw: Gateway, ctx: RequestContext) -> msg.ProcessingResponse:
    raise NotFound(f"Unknown request URL: {ctx.method} {ctx.path}")


def stored_response(gw: Gateway, ctx: RequestContext) -> msg.ProcessingResponse:
    """`GET /v1/responses/{id}` and its kin: nothing is stored, so say that rather than 'unknown URL'."""
    raise NotFound("This gateway does not store responses, so none can be retrieved, listed, cancelled or "
                   "deleted; send the whole conversation in `input` instead of `previous_response_id`.")
