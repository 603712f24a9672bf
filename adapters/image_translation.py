"""Which image-generation upstreams an OpenAI `/v1/images/generations` call is translated for, and
the translation each way (pure): Imagen on Vertex AI (adapters/vertex/images.py), Gemini's image
output on the Gemini API or Vertex AI (adapters/gemini/images.py; a Vertex model named `gemini-*`)
and Titan Image on Bedrock (adapters/bedrock/images.py). OpenAI-shaped deployments are passed
through (adapters/media.py).
"""

from __future__ import annotations

from typing import Literal

import orjson

from adapters.bedrock import images as titan
from adapters.cloud_targets import BedrockTarget, CloudTarget, VertexTarget
from adapters.gemini import images as gemini_images
from adapters.gemini.render import request_path as gemini_path
from adapters.image_generation import ImageAsk, parse_ask
from adapters.internal import UpstreamRequest
from adapters.json_types import JSONObject
from adapters.vertex import images as imagen
from adapters.vertex.request import model_path as vertex_path
from contracts.errors import ClientError, UpstreamError

__all__ = ["TRANSLATED", "Kind", "render_request", "render_answer"]

TRANSLATED = frozenset({"vertex", "bedrock", "gemini"})
Kind = Literal["imagen", "titan", "gemini"]  # the provider API a call was rendered for


def render_request(protocol: str, obj: JSONObject, *, upstream_model: str, credential: str | None,
                   cloud: CloudTarget | None) -> tuple[UpstreamRequest, ImageAsk, Kind]:
    """The upstream request for a deployment of `protocol`, what was asked and which API it went to
    (the answer needs both)."""
    if protocol == "gemini":
        ask = parse_ask(obj, gemini_images.PROVIDER)
        headers = {"content-type": "application/json"}
        if credential:
            headers["x-goog-api-key"] = credential
        body = orjson.dumps(gemini_images.render_body(ask))
        return UpstreamRequest(gemini_path(upstream_model, False), headers, body), ask, "gemini"
    if protocol == "vertex":
        if not isinstance(cloud, VertexTarget):
            raise UpstreamError("vertex deployment has no `vertex:` settings")
        if cloud.publisher != "google":
            raise ClientError(f"image generation on Vertex is Google's (Imagen, Gemini), not {cloud.publisher}'s")
        headers = {"content-type": "application/json"}
        if credential:
            headers["authorization"] = "Bearer " + credential
        if upstream_model.startswith("gemini"):  # Gemini's image output at Vertex's publisher path
            ask = parse_ask(obj, gemini_images.PROVIDER)
            body = orjson.dumps(gemini_images.render_body(ask))
            return UpstreamRequest(vertex_path(cloud, upstream_model, False), headers, body), ask, "gemini"
        ask = parse_ask(obj, imagen.PROVIDER)
        body = orjson.dumps(imagen.render_request(ask))
        return UpstreamRequest(imagen.predict_path(cloud, upstream_model), headers, body), ask, "imagen"
    if protocol == "bedrock":
        if not isinstance(cloud, BedrockTarget):
            raise UpstreamError("bedrock deployment has no region or credentials resolved")
        ask = parse_ask(obj, titan.PROVIDER)
        return titan.render_request(ask, upstream_model, cloud), ask, "titan"
    raise ClientError(f"image generation is not translated for {protocol} deployments")


def render_answer(kind: Kind, body: bytes, ask: ImageAsk, created: int) -> bytes:
    """The upstream's successful answer as OpenAI's images response."""
    if kind == "imagen":
        return orjson.dumps(imagen.parse_answer(body, created, ask.output_format))
    if kind == "gemini":
        return orjson.dumps(gemini_images.parse_answer(body, created))
    return orjson.dumps(titan.parse_answer(body, created))
