"""The demo clouds' image models, answering as their providers document: Imagen's `:predict` on the
demo Vertex AI (`{"predictions": [{"bytesBase64Encoded", "mimeType"}]}`), Gemini's image output
(generateContent with `responseModalities` naming IMAGE) on the demo Gemini API and Vertex AI, and
Titan Image Generator's InvokeModel on the demo Bedrock (`{"images": [...], "error": null}`). Each
checks the request's documented shape and answers the demo's small PNG, whatever the prompt.
"""

from __future__ import annotations

import base64
from typing import Any

import orjson
from aiohttp import web

from devstack.demo.media import PNG

_B64 = base64.b64encode(PNG).decode()
_IMAGEN_RATIOS = {"1:1", "3:4", "4:3", "9:16", "16:9"}


def _json(request_body: bytes) -> Any:
    try:
        return orjson.loads(request_body or b"null")
    except orjson.JSONDecodeError:
        return None


def imagen(body: bytes) -> tuple[int, dict[str, Any]]:
    """(status, JSON) for an Imagen `:predict` request; a 400 in Google's error shape when malformed."""
    doc = _json(body)
    instances = doc.get("instances") if isinstance(doc, dict) else None
    params = doc.get("parameters", {}) if isinstance(doc, dict) else None
    if (not isinstance(instances, list) or len(instances) != 1 or not isinstance(instances[0], dict)
            or not isinstance(instances[0].get("prompt"), str) or not isinstance(params, dict)):
        return 400, _google(400, "instances must hold one {prompt} and parameters must be an object")
    count = params.get("sampleCount", 4)
    ratio = params.get("aspectRatio", "1:1")
    mime = (params.get("outputOptions") or {}).get("mimeType", "image/png")
    if not isinstance(count, int) or not 1 <= count <= 4 or ratio not in _IMAGEN_RATIOS:
        return 400, _google(400, "sampleCount must be 1-4 and aspectRatio one of 1:1, 3:4, 4:3, 9:16, 16:9")
    if mime not in ("image/png", "image/jpeg"):
        return 400, _google(400, "outputOptions.mimeType must be image/png or image/jpeg")
    return 200, {"predictions": [{"bytesBase64Encoded": _B64, "mimeType": mime} for _ in range(count)]}


def _google(code: int, message: str) -> dict[str, Any]:
    return {"error": {"code": code, "message": message, "status": "INVALID_ARGUMENT"}}


def titan(body: bytes) -> web.Response:
    doc = _json(body)
    text = ((doc.get("textToImageParams") or {}).get("text") if isinstance(doc, dict) else None)
    config = doc.get("imageGenerationConfig", {}) if isinstance(doc, dict) else None
    if not isinstance(doc, dict) or doc.get("taskType") != "TEXT_IMAGE" or not isinstance(text, str) or not text:
        return _validation("taskType must be TEXT_IMAGE with textToImageParams.text")
    n = config.get("numberOfImages", 1) if isinstance(config, dict) else None
    if not isinstance(n, int) or not 1 <= n <= 5:
        return _validation("imageGenerationConfig.numberOfImages must be 1-5")
    if isinstance(config, dict) and config.get("quality", "standard") not in ("standard", "premium"):
        return _validation("imageGenerationConfig.quality must be standard or premium")
    return web.json_response({"images": [_B64] * n, "error": None})


def _validation(message: str) -> web.Response:
    return web.Response(status=400, body=orjson.dumps({"message": message}), content_type="application/json",
                        headers={"x-amzn-ErrorType": "ValidationException"})


def wants_image(body: bytes) -> bool:
    """A generateContent request that asks for image output."""
    doc = _json(body)
    config = doc.get("generationConfig") if isinstance(doc, dict) else None
    modalities = config.get("responseModalities") if isinstance(config, dict) else None
    return isinstance(modalities, list) and "IMAGE" in modalities


def gemini_image(body: bytes) -> tuple[int, dict[str, Any]]:
    """(status, JSON) for a generateContent request with image output."""
    doc = _json(body)
    contents = doc.get("contents") if isinstance(doc, dict) else None
    ratio = ((doc.get("generationConfig") or {}).get("imageConfig") or {}).get("aspectRatio", "1:1") \
        if isinstance(doc, dict) else None
    if not isinstance(contents, list) or not contents or ratio not in {"1:1", "2:3", "3:2", "3:4", "4:3", "4:5",
                                                                        "5:4", "9:16", "16:9", "21:9"}:
        return 400, _google(400, "contents must be a non-empty list and imageConfig.aspectRatio a known ratio")
    parts = [{"text": "Here is the image."}, {"inlineData": {"mimeType": "image/png", "data": _B64}}]
    return 200, {"candidates": [{"content": {"role": "model", "parts": parts}, "finishReason": "STOP", "index": 0}],
                 "usageMetadata": {"promptTokenCount": 8, "candidatesTokenCount": 1290, "totalTokenCount": 1298}}
