"""OpenAI image generation <-> Imagen on Vertex AI (`:predict`), pure.

Request (Vertex AI "Imagen API" reference, cloud.google.com/vertex-ai/generative-ai/docs/model-reference/imagen-api):
    POST /v1/projects/{p}/locations/{l}/publishers/google/models/{model}:predict
    {"instances": [{"prompt": "..."}], "parameters": {"sampleCount": 1-4, "aspectRatio": "1:1",
     "outputOptions": {"mimeType": "image/png"}}}
Answer: {"predictions": [{"bytesBase64Encoded": "...", "mimeType": "image/png", "prompt"?: "..."}]}
(a prediction the safety filter removed carries `raiFilteredReason` and no bytes: it is skipped).

`size` maps to Imagen's `aspectRatio` only when its reduced ratio is one Imagen offers (1024x1024
is 1:1, 1024x768 is 4:3); the pixels are Imagen's own for that ratio.
"""

from __future__ import annotations

from math import gcd
from typing import NotRequired, TypedDict

import orjson

from adapters.cloud_targets import VertexTarget
from adapters.image_generation import ImageAsk, ImagesAnswer, render_answer
from adapters.json_types import JSONObject
from adapters.vertex.request import model_path
from contracts.errors import ClientError, UpstreamError

__all__ = ["ImagenRequest", "predict_path", "render_request", "parse_answer"]

PROVIDER = "Imagen"
MAX_SAMPLES = 4  # Imagen's sampleCount bound
ASPECT_RATIOS = frozenset({"1:1", "3:4", "4:3", "9:16", "16:9"})
_MIME = {"png": "image/png", "jpeg": "image/jpeg"}


class ImagenInstance(TypedDict):
    prompt: str


class ImagenOutputOptions(TypedDict):
    mimeType: str


class ImagenParameters(TypedDict):
    sampleCount: int
    aspectRatio: NotRequired[str]
    outputOptions: ImagenOutputOptions


class ImagenRequest(TypedDict):
    instances: list[ImagenInstance]
    parameters: ImagenParameters


def predict_path(target: VertexTarget, model: str) -> str:
    base = model_path(target, model, False)  # ...:generateContent for the google publisher
    return base.rpartition(":")[0] + ":predict"


def aspect_ratio(size: tuple[int, int]) -> str:
    w, h = size
    d = gcd(w, h) or 1
    ratio = f"{w // d}:{h // d}"
    if ratio not in ASPECT_RATIOS:
        raise ClientError(f"size {w}x{h} has aspect ratio {ratio}; {PROVIDER} offers "
                          f"{', '.join(sorted(ASPECT_RATIOS))}")
    return ratio


def render_request(ask: ImageAsk) -> ImagenRequest:
    if ask.n > MAX_SAMPLES:
        raise ClientError(f"n must be at most {MAX_SAMPLES} for {PROVIDER} models")
    if ask.quality not in (None, "standard"):
        raise ClientError(f"quality {ask.quality!r} is not supported by {PROVIDER} models (standard or auto)")
    mime = _MIME.get(ask.output_format)
    if mime is None:
        raise ClientError(f"output_format {ask.output_format!r} is not supported by {PROVIDER} models (png, jpeg)")
    params: ImagenParameters = {"sampleCount": ask.n, "outputOptions": {"mimeType": mime}}
    if ask.size is not None:
        params["aspectRatio"] = aspect_ratio(ask.size)
    return {"instances": [{"prompt": ask.prompt}], "parameters": params}


def parse_answer(body: bytes, created: int, output_format: str) -> ImagesAnswer:
    """Imagen's predictions as OpenAI's images answer; UpstreamError for an answer of another shape."""
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError:
        raise UpstreamError("the Imagen answer is not JSON") from None
    preds = doc.get("predictions", []) if isinstance(doc, dict) else None
    if not isinstance(preds, list):
        raise UpstreamError("the Imagen answer has no predictions list")
    images: list[tuple[str, str | None]] = []
    for p in preds:
        if not isinstance(p, dict):
            continue
        pred: JSONObject = p
        b64, revised = pred.get("bytesBase64Encoded"), pred.get("prompt")
        if isinstance(b64, str) and b64:
            images.append((b64, revised if isinstance(revised, str) else None))
    return render_answer(images, created, output_format)
