"""OpenAI image generation <-> Amazon Titan Image Generator on Bedrock's InvokeModel, pure.

Request (Bedrock user guide, "Amazon Titan Image Generator" and the InvokeModel TitanImageGenerator
code example, docs.aws.amazon.com/bedrock/latest/userguide/):
    POST /model/{modelId}/invoke       (SigV4-signed, like Converse)
    {"taskType": "TEXT_IMAGE", "textToImageParams": {"text": "..."},
     "imageGenerationConfig": {"numberOfImages": 1-5, "quality": "standard"|"premium",
                               "width": 1024, "height": 1024}}
Answer: {"images": ["<base64 PNG>", ...], "error": null}

`size` must be one of Titan's sizes; `quality` standard -> standard, hd/high -> premium; PNG only.
"""

from __future__ import annotations

from typing import Literal, NotRequired, TypedDict
from urllib.parse import quote

import orjson

from adapters.bedrock.signing import sign
from adapters.cloud_targets import BedrockTarget
from adapters.image_generation import ImageAsk, ImagesAnswer, render_answer
from adapters.internal import UpstreamRequest
from contracts.errors import ClientError, UpstreamError

__all__ = ["TitanImageRequest", "invoke_path", "render_body", "render_request", "parse_answer"]

PROVIDER = "Titan Image"
MAX_IMAGES = 5  # Titan's numberOfImages bound
# The width x height pairs Titan Image Generator accepts (its user guide's table).
SIZES = frozenset({(1024, 1024), (768, 768), (512, 512), (768, 1152), (384, 576), (1152, 768), (576, 384),
                   (768, 1280), (384, 640), (1280, 768), (640, 384), (896, 1152), (448, 576), (1152, 896),
                   (576, 448), (768, 1408), (384, 704), (1408, 768), (704, 384), (640, 1408), (320, 704),
                   (1408, 640), (704, 320), (1152, 640), (1173, 640)})
_QUALITY: dict[str, Literal["standard", "premium"]] = {"standard": "standard", "hd": "premium", "high": "premium"}


class TextToImageParams(TypedDict):
    text: str


class ImageGenerationConfig(TypedDict):
    numberOfImages: int
    quality: NotRequired[Literal["standard", "premium"]]
    width: NotRequired[int]
    height: NotRequired[int]


class TitanImageRequest(TypedDict):
    taskType: Literal["TEXT_IMAGE"]
    textToImageParams: TextToImageParams
    imageGenerationConfig: ImageGenerationConfig


def invoke_path(model_id: str) -> str:
    return f"/model/{quote(model_id, safe='')}/invoke"


def render_body(ask: ImageAsk) -> TitanImageRequest:
    if ask.n > MAX_IMAGES:
        raise ClientError(f"n must be at most {MAX_IMAGES} for {PROVIDER} models")
    if ask.output_format != "png":
        raise ClientError(f"{PROVIDER} models answer PNG only: output_format must be png")
    config: ImageGenerationConfig = {"numberOfImages": ask.n}
    if ask.quality is not None:
        q = _QUALITY.get(ask.quality)
        if q is None:
            raise ClientError(f"quality {ask.quality!r} is not supported by {PROVIDER} models (standard, hd, high)")
        config["quality"] = q
    if ask.size is not None:
        if ask.size not in SIZES:
            raise ClientError(f"size {ask.size[0]}x{ask.size[1]} is not one of {PROVIDER}'s sizes "
                              "(1024x1024, 512x512, 768x768, 1152x896, ...)")
        config["width"], config["height"] = ask.size
    return {"taskType": "TEXT_IMAGE", "textToImageParams": {"text": ask.prompt}, "imageGenerationConfig": config}


def render_request(ask: ImageAsk, model_id: str, target: BedrockTarget) -> UpstreamRequest:
    """The InvokeModel request, SigV4-signed for the deployment's region and Host."""
    if target.credentials is None:
        raise UpstreamError("bedrock deployment has no credentials resolved")
    body = orjson.dumps(render_body(ask))
    path = invoke_path(model_id)
    headers = {"content-type": "application/json", "accept": "application/json"}
    headers.update(sign(target.host, path, body, headers, target.region, target.credentials))
    return UpstreamRequest(path, headers, body)


def parse_answer(body: bytes, created: int) -> ImagesAnswer:
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError:
        raise UpstreamError("the Titan Image answer is not JSON") from None
    images = doc.get("images") if isinstance(doc, dict) else None
    if not isinstance(images, list):
        error = doc.get("error") if isinstance(doc, dict) else None
        raise UpstreamError(f"the Titan Image answer has no images{': ' + error if isinstance(error, str) else ''}")
    return render_answer([(b, None) for b in images if isinstance(b, str) and b], created, "png")
