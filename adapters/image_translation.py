"""Which image-generation upstreams an OpenAI `/v1/images/generations` call is translated for, and
the translation each way (pure): Imagen on Vertex AI (adapters/vertex/images.py) and Titan Image on
Bedrock (adapters/bedrock/images.py). OpenAI-shaped deployments are passed through (adapters/media.py).
"""

from __future__ import annotations

import orjson

from adapters.bedrock import images as titan
from adapters.cloud_targets import BedrockTarget, CloudTarget, VertexTarget
from adapters.image_generation import ImageAsk, parse_ask
from adapters.internal import UpstreamRequest
from adapters.json_types import JSONObject
from adapters.vertex import images as imagen
from contracts.errors import ClientError, UpstreamError

__all__ = ["TRANSLATED", "render_request", "render_answer"]

TRANSLATED = frozenset({"vertex", "bedrock"})


def render_request(protocol: str, obj: JSONObject, *, upstream_model: str, credential: str | None,
                   cloud: CloudTarget | None) -> tuple[UpstreamRequest, ImageAsk]:
    """The upstream request for a deployment of `protocol`, and what was asked (its answer needs it)."""
    if protocol == "vertex":
        if not isinstance(cloud, VertexTarget):
            raise UpstreamError("vertex deployment has no `vertex:` settings")
        if cloud.publisher != "google":
            raise ClientError(f"image generation on Vertex is Imagen's (publisher google), not {cloud.publisher}'s")
        ask = parse_ask(obj, imagen.PROVIDER)
        headers = {"content-type": "application/json"}
        if credential:
            headers["authorization"] = "Bearer " + credential
        body = orjson.dumps(imagen.render_request(ask))
        return UpstreamRequest(imagen.predict_path(cloud, upstream_model), headers, body), ask
    if protocol == "bedrock":
        if not isinstance(cloud, BedrockTarget):
            raise UpstreamError("bedrock deployment has no region or credentials resolved")
        ask = parse_ask(obj, titan.PROVIDER)
        return titan.render_request(ask, upstream_model, cloud), ask
    raise ClientError(f"image generation is not translated for {protocol} deployments")


def render_answer(protocol: str, body: bytes, ask: ImageAsk, created: int) -> bytes:
    """The upstream's successful answer as OpenAI's images response."""
    if protocol == "vertex":
        return orjson.dumps(imagen.parse_answer(body, created, ask.output_format))
    return orjson.dumps(titan.parse_answer(body, created))
