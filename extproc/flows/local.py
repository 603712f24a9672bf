"""Answers without an inference: model lists from config; KServe health, readiness and model
metadata from the upstream the scheduler would pick (asked through `Gateway.kserve_probe`)."""

from __future__ import annotations

import asyncio
import importlib.metadata
from typing import Any

import orjson

from adapters import anthropic, gemini, kserve, kserve_meta, responses
from adapters.internal import estimate_prompt_tokens
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


# -- each protocol's model listing, and Anthropic's token count ------------------------------------
_EPOCH = "1970-01-01T00:00:00Z"  # config models have no release date


def _anthropic_card(m: ModelConfig) -> dict[str, Any]:
    return {"type": "model", "id": m.name, "display_name": m.name, "created_at": _EPOCH}


def list_models_any(gw: Gateway, ctx: RequestContext) -> msg.ProcessingResponse:
    """`GET /v1/models` in the shape of the client that asks (the session's `caller_protocol`: OpenAI's list,
    Anthropic's page, or Gemini's list: google-genai asks on `/v1/` by default)."""
    if ctx.protocol == "gemini":
        return gemini_list_models(gw, ctx)
    if ctx.protocol != "anthropic":
        return list_models(gw, ctx)
    assert ctx.tenant is not None
    cards = [_anthropic_card(m) for m in gw.catalog.visible(ctx.tenant)]
    return json_response(200, {"data": cards, "has_more": False, "first_id": cards[0]["id"] if cards else None,
                               "last_id": cards[-1]["id"] if cards else None}, ctx)


def get_model_any(gw: Gateway, ctx: RequestContext) -> msg.ProcessingResponse:
    if ctx.protocol == "gemini":
        return gemini_get_model(gw, ctx)
    if ctx.protocol != "anthropic":
        return get_model(gw, ctx)
    return json_response(200, _anthropic_card(gw.catalog.model_for(ctx.tenant, ctx.path_model or "")), ctx)


_GEMINI_METHODS = {"chat": ["generateContent", "streamGenerateContent"],
                   "embedding": ["embedContent", "batchEmbedContents"]}


def _gemini_card(m: ModelConfig) -> dict[str, Any]:
    methods = [name for t in m.task_types for name in _GEMINI_METHODS.get(t, ())]
    caps = m.capabilities
    return {"name": f"models/{m.name}", "baseModelId": m.name, "version": "001", "displayName": m.name,
            "inputTokenLimit": caps.context_window, "outputTokenLimit": caps.max_output_tokens,
            "supportedGenerationMethods": methods}


def gemini_list_models(gw: Gateway, ctx: RequestContext) -> msg.ProcessingResponse:
    assert ctx.tenant is not None
    return json_response(200, {"models": [_gemini_card(m) for m in gw.catalog.visible(ctx.tenant)]}, ctx)


def gemini_get_model(gw: Gateway, ctx: RequestContext) -> msg.ProcessingResponse:
    return json_response(200, _gemini_card(gw.catalog.model_for(ctx.tenant, ctx.path_model or "")), ctx)


async def count_tokens(gw: Gateway, ctx: RequestContext, body: bytes) -> msg.ProcessingResponse:
    """`POST /v1/messages/count_tokens`: the gateway's own estimate (about four characters a token,
    plus per-message and per-image overheads), the one its token buckets charge on arrival and its
    metering falls back to when an upstream reports no usage; no provider tokenizer is asked."""
    req = anthropic.parse_count_tokens(body)
    gw.catalog.model_for(ctx.tenant, req.model)  # unknown or not the tenant's: 404, as a call would get
    return json_response(200, {"input_tokens": estimate_prompt_tokens(req)}, ctx)


async def gemini_count_tokens(gw: Gateway, ctx: RequestContext, body: bytes) -> msg.ProcessingResponse:
    """`POST .../models/{model}:countTokens`: the same estimate in Gemini's shape."""
    req = gemini.parse_count_tokens(body, path_model=ctx.path_model)
    gw.catalog.model_for(ctx.tenant, req.model)  # unknown or not the tenant's: 404, as a call would get
    return json_response(200, {"totalTokens": estimate_prompt_tokens(req)}, ctx)


async def responses_input_tokens(gw: Gateway, ctx: RequestContext, body: bytes) -> msg.ProcessingResponse:
    """`POST /v1/responses/input_tokens`: the same estimate in the Responses API's shape. Its model is
    optional (the estimate is every model's); one named must be the tenant's, as a call's."""
    req = responses.parse_input_tokens(body)
    if req.model:
        gw.catalog.model_for(ctx.tenant, req.model)
    return json_response(200, {"object": "response.input_tokens", "input_tokens": estimate_prompt_tokens(req)}, ctx)
