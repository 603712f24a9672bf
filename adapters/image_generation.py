"""OpenAI's `/v1/images/generations` request and answer, pure, for the providers it is translated to
(adapters/vertex/images.py: Imagen's `:predict`; adapters/bedrock/images.py: Titan Image on
InvokeModel). Only what maps exactly is translated; anything else is refused with a 400 that names
the field, before any upstream call.

The answer is always base64 (`b64_json`): those providers return the image bytes, never a URL, so a
request that asks for `response_format: url` is refused rather than answered in another shape.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import NotRequired, TypedDict

from adapters.json_types import JSONObject
from contracts.errors import ClientError

__all__ = ["ImageAsk", "ImageDatum", "ImagesAnswer", "parse_ask", "render_answer"]

# Fields whose value the translation reads (checked per provider), and fields that only tell the
# provider something it has no use for (OpenAI's abuse-monitoring `user`).
_READ = frozenset({"model", "prompt", "n", "size", "quality", "response_format", "output_format", "stream"})
_IGNORED = frozenset({"user"})
# OpenAI's own defaults: a field set to one of these asks nothing of the provider.
_DEFAULTS: Mapping[str, object] = {"background": "auto", "moderation": "auto", "style": None,
                                   "output_compression": None, "partial_images": 0}


@dataclass(frozen=True, slots=True)
class ImageAsk:
    """What an OpenAI image-generation request asks, in the terms the translations read."""

    prompt: str
    n: int
    size: tuple[int, int] | None  # None: `auto` or not given
    quality: str | None  # None: `auto` or not given
    output_format: str  # png (OpenAI's default) or jpeg or webp


class ImageDatum(TypedDict):
    b64_json: str
    revised_prompt: NotRequired[str]


class ImagesAnswer(TypedDict):
    created: int
    data: list[ImageDatum]
    output_format: NotRequired[str]


def _size(raw: object) -> tuple[int, int] | None:
    if raw is None or raw == "auto":
        return None
    if isinstance(raw, str):
        w, sep, h = raw.partition("x")
        if sep and w.isdigit() and h.isdigit():
            return int(w), int(h)
    raise ClientError(f"size must be WIDTHxHEIGHT or auto, not {raw!r}")


def parse_ask(obj: JSONObject, provider: str) -> ImageAsk:
    """The request (already checked for `model`, `prompt` and `n` by adapters/media.py) as an
    ImageAsk; ClientError for a field `provider` cannot honour."""
    for key, value in obj.items():
        if key in _READ or key in _IGNORED:
            continue
        if key in _DEFAULTS and value == _DEFAULTS[key]:
            continue
        raise ClientError(f"{key} is not supported by {provider} image models")
    if obj.get("stream"):
        raise ClientError(f"{provider} image models do not stream partial images")
    fmt = obj.get("response_format")
    if fmt not in (None, "b64_json"):
        raise ClientError(f"{provider} image models return the image itself: response_format must be b64_json")
    out = obj.get("output_format", "png")
    if out not in ("png", "jpeg", "webp"):
        raise ClientError(f"output_format must be png, jpeg or webp, not {out!r}")
    quality = obj.get("quality")
    if quality is not None and not isinstance(quality, str):
        raise ClientError("quality must be a string")
    prompt, n = obj["prompt"], obj.get("n", 1)
    assert isinstance(prompt, str) and isinstance(n, int)  # media.parse_request checked both
    return ImageAsk(prompt, n, _size(obj.get("size")), None if quality in (None, "auto") else quality, out)


def render_answer(images: Sequence[tuple[str, str | None]], created: int, output_format: str) -> ImagesAnswer:
    """OpenAI's images response: each (base64 bytes, the prompt the provider rewrote it to or None)."""
    data: list[ImageDatum] = []
    for b64, revised in images:
        datum: ImageDatum = {"b64_json": b64}
        if revised:
            datum["revised_prompt"] = revised
        data.append(datum)
    return {"created": created, "data": data, "output_format": output_format}
