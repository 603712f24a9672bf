"""OpenAI image generation <-> Gemini's generateContent with image output (gemini-2.5-flash-image and
its kin), pure; on the Gemini API (`protocol: gemini`) or at Vertex AI's publisher path.

Request (Gemini API "Image generation" guide, ai.google.dev/gemini-api/docs/image-generation):
    POST /v1beta/models/{model}:generateContent
    {"contents": [{"role": "user", "parts": [{"text": "..."}]}],
     "generationConfig": {"responseModalities": ["TEXT", "IMAGE"], "imageConfig": {"aspectRatio": "3:2"}}}
Answer: {"candidates": [{"content": {"parts": [{"text": "..."}, {"inlineData": {"mimeType": "image/png",
         "data": "<base64>"}}]}}], ...}

One image per call (`n` must be 1); `size` maps to `imageConfig.aspectRatio` when its reduced ratio
is one Gemini offers; the answer's text parts are dropped, its image parts are the images.
"""

from __future__ import annotations

from math import gcd
from typing import Literal, NotRequired, TypedDict

import orjson

from adapters.image_generation import ImageAsk, ImagesAnswer, render_answer
from contracts.errors import ClientError, UpstreamError

__all__ = ["GeminiImageRequest", "render_body", "parse_answer"]

PROVIDER = "Gemini image"
ASPECT_RATIOS = frozenset({"1:1", "2:3", "3:2", "3:4", "4:3", "4:5", "5:4", "9:16", "16:9", "21:9"})


class _Text(TypedDict):
    text: str


class _Content(TypedDict):
    role: Literal["user"]
    parts: list[_Text]


class _ImageConfig(TypedDict):
    aspectRatio: str


class _GenerationConfig(TypedDict):
    responseModalities: list[str]
    imageConfig: NotRequired[_ImageConfig]


class GeminiImageRequest(TypedDict):
    contents: list[_Content]
    generationConfig: _GenerationConfig


def render_body(ask: ImageAsk) -> GeminiImageRequest:
    if ask.n != 1:
        raise ClientError(f"n must be 1 for {PROVIDER} models (one image per call)")
    if ask.quality not in (None, "standard"):
        raise ClientError(f"quality {ask.quality!r} is not supported by {PROVIDER} models (standard or auto)")
    if ask.output_format != "png":
        raise ClientError(f"{PROVIDER} models answer PNG: output_format must be png")
    config: _GenerationConfig = {"responseModalities": ["TEXT", "IMAGE"]}
    if ask.size is not None:
        w, h = ask.size
        d = gcd(w, h) or 1
        ratio = f"{w // d}:{h // d}"
        if ratio not in ASPECT_RATIOS:
            raise ClientError(f"size {w}x{h} has aspect ratio {ratio}; {PROVIDER} models offer "
                              f"{', '.join(sorted(ASPECT_RATIOS))}")
        config["imageConfig"] = {"aspectRatio": ratio}
    return {"contents": [{"role": "user", "parts": [{"text": ask.prompt}]}], "generationConfig": config}


def parse_answer(body: bytes, created: int) -> ImagesAnswer:
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError:
        raise UpstreamError("the Gemini answer is not JSON") from None
    candidates = doc.get("candidates", []) if isinstance(doc, dict) else None
    if not isinstance(candidates, list):
        raise UpstreamError("the Gemini answer has no candidates list")
    images: list[tuple[str, str | None]] = []
    for c in candidates:
        content = c.get("content") if isinstance(c, dict) else None
        parts = content.get("parts") if isinstance(content, dict) else None
        for p in parts if isinstance(parts, list) else []:
            inline = p.get("inlineData") if isinstance(p, dict) else None
            if isinstance(inline, dict) and str(inline.get("mimeType", "")).startswith("image/") \
                    and isinstance(inline.get("data"), str) and inline["data"]:
                images.append((inline["data"], None))
    return render_answer(images, created, "png")
