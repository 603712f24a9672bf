"""Answers without an inference: model lists from config; KServe health, readiness and model
metadata from the upstream the scheduler would pick (asked through `Gateway.kserve_probe`)."""

from __future__ import annotations

import asyncio
import importlib.metadata
from typing import Any

import orjson

from adapters import kserve, kserve_meta
from contracts.config import KSERVE_PROTOCOLS, ModelConfig
from contracts.errors import ClientError, NotFound, UnknownModel
from extproc import messages as msg
from extproc.admission.choice import Choice
from extproc.context import RequestContext, json_response
from extproc.gateway import Gateway
from extproc.routing import RouteRequest


def _model_card(m: ModelConfig) -> dict[str, Any]:
    return {"id": m.name, "object": "model", "created": 0, "owned_by": m.owned_by,
            "task_types": list(m.task_types)}


def list_models(gw: Gateway, ctx: RequestContext) -> msg.ProcessingResponse:
    assert ctx.tenant is not None
    return json_response(200, {"object": "list", "data": [_model_card(m) for m in gw.catalog.visible(ctx.tenant)]},
                         ctx)


def get_model(gw: Gateway, ctx: RequestContext) -> msg.ProcessingResponse:
    return json_response(200, _model_card(gw.catalog.model_for(ctx.tenant, ctx.path_model or "")), ctx)


def server_version() -> str:
    try:
        return importlib.metadata.version("modelyard")
    except importlib.metadata.PackageNotFoundError:
        return "0"


def v2_live(gw: Gateway, ctx: RequestContext) -> msg.ProcessingResponse:
    """Liveness is the gateway's own: it answered, so it lives (restarting it fixes no upstream)."""
    return json_response(200, {"live": True}, ctx)


async def v2_ready(gw: Gateway, ctx: RequestContext) -> msg.ProcessingResponse:
    """Ready when every KServe model has a deployment whose server says it is ready."""
    ready = await server_ready(gw)
    return json_response(200 if ready else 400, {"ready": ready}, ctx)


async def server_ready(gw: Gateway) -> bool:
    probe = gw.kserve_probe
    models = [[d for d in m.deployments if d.protocol in KSERVE_PROTOCOLS] for m in gw.config.models]
    models = [deps for deps in models if deps]
    # Every deployment asked at once: one slow upstream costs one timeout, not one per model.
    answers = iter(await asyncio.gather(*(probe.server_ready(d) for deps in models for d in deps)))
    return all([any([next(answers) for _ in deps]) for deps in models])


def v2_server_metadata(gw: Gateway, ctx: RequestContext) -> msg.ProcessingResponse:
    return json_response(200, kserve_meta.server_metadata(server_version()), ctx)


def kserve_choice(gw: Gateway, ctx: RequestContext, name: str) -> Choice:
    """The deployment an inference for `name` would go to now (no admission: nothing is sent)."""
    assert ctx.tenant is not None
    model = gw.catalog.model_for(ctx.tenant, name)
    task = "infer" if "infer" in model.task_types else "image-classification"  # a classify-only model too
    choice = gw.dispatcher.choose(RouteRequest(model=name, tenant=ctx.tenant, task_type=task, task_id=ctx.task_id))
    if choice.deployment.protocol not in KSERVE_PROTOCOLS:
        raise ClientError(f"model `{name}` is not served over KServe v2")
    return choice


async def model_ready(gw: Gateway, ctx: RequestContext, name: str, version: str | None) -> bool:
    choice = kserve_choice(gw, ctx, name)
    dep = choice.deployment
    return await gw.kserve_probe.model_ready(dep, dep.upstream_model or name, version)


async def model_metadata(gw: Gateway, ctx: RequestContext, name: str, version: str | None) -> dict[str, Any]:
    """The upstream's metadata for the model, under the gateway's name for it."""
    choice = kserve_choice(gw, ctx, name)
    dep = choice.deployment
    try:
        doc = await gw.kserve_probe.model_metadata(dep, dep.upstream_model or name, version)
    except NotFound:  # said with the caller's names, never the upstream's
        raise UnknownModel(f"The model `{name}`" + (f" version `{version}`" if version else "")
                       + " is not served by its upstream.") from None
    return {**doc, "name": name}


async def v2_model_ready(gw: Gateway, ctx: RequestContext) -> msg.ProcessingResponse:
    name = ctx.path_model or ""
    ready = await model_ready(gw, ctx, name, ctx.path_version)
    if ready:
        return json_response(200, {"name": name, "ready": True}, ctx)
    body = kserve.render_error(400, f"model `{name}` is not ready")
    return msg.immediate(400, body, [("content-type", "application/json"), *ctx.task_headers()])


async def v2_model_metadata(gw: Gateway, ctx: RequestContext) -> msg.ProcessingResponse:
    doc = await model_metadata(gw, ctx, ctx.path_model or "", ctx.path_version)
    return msg.immediate(200, orjson.dumps(doc), [("content-type", "application/json"), *ctx.task_headers()])


def not_found(gw: Gateway, ctx: RequestContext) -> msg.ProcessingResponse:
    raise NotFound(f"Unknown request URL: {ctx.method} {ctx.path}")


def stored_response(gw: Gateway, ctx: RequestContext) -> msg.ProcessingResponse:
    """`GET /v1/responses/{id}` and its kin: nothing is stored, so say that rather than 'unknown URL'."""
    raise NotFound("This gateway does not store responses, so none can be retrieved, listed, cancelled or "
                   "deleted; send the whole conversation in `input` instead of `previous_response_id`.")
