"""OpenAI's image and audio endpoints, pure: what a request asks (its model, and the units it will
be billed in), the body for the upstream with the model renamed, and the units an answer reports.

    POST /v1/images/generations  JSON       billed per image (the answer's `data` entries)
    POST /v1/images/edits        multipart  per image
    POST /v1/audio/transcriptions multipart per second of audio
    POST /v1/audio/translations  multipart  per second of audio
    POST /v1/audio/speech        JSON       per character of `input`; the answer is audio bytes
    POST /v1/moderations         JSON       per character of `input` (text, or text parts)

These pass through to OpenAI-shaped deployments (OpenAI, vLLM, whisper servers): the caller's body
goes as sent, only `model` renamed where the deployment's name differs.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Literal

import orjson

from adapters.fields import load_object
from adapters.json_types import JSONObject
from adapters.multipart import MultipartLimits, Part, boundary_of, parse_multipart
from contracts.errors import ClientError

Unit = Literal["image", "second", "character"]
Kind = Literal["images.generations", "images.edits", "audio.transcriptions", "audio.translations", "audio.speech",
               "moderations"]


@dataclass(frozen=True, slots=True)
class Endpoint:
    kind: Kind
    path: str
    multipart: bool
    unit: Unit
    task_type: str  # the `task_types` entry a model needs to be routed this call


ENDPOINTS: dict[str, Endpoint] = {e.path: e for e in (
    Endpoint("images.generations", "/v1/images/generations", False, "image", "image-generation"),
    Endpoint("images.edits", "/v1/images/edits", True, "image", "image-generation"),
    Endpoint("audio.transcriptions", "/v1/audio/transcriptions", True, "second", "transcription"),
    Endpoint("audio.translations", "/v1/audio/translations", True, "second", "transcription"),
    Endpoint("audio.speech", "/v1/audio/speech", False, "character", "speech"),
    Endpoint("moderations", "/v1/moderations", False, "character", "moderation"),
)}
_MAX_IMAGES = 10  # OpenAI's bound on `n`
_MAX_SPEECH_CHARS = 4096  # OpenAI's bound on `input`


@dataclass(frozen=True, slots=True)
class MediaRequest:
    endpoint: Endpoint
    model: str
    stream: bool  # audio.speech with `stream_format: sse`, or a transcription with `stream: true`
    est_units: float  # images asked for, characters to speak; 0 where only the answer tells
    json: JSONObject | None = None  # a JSON body, parsed
    parts: tuple[Part, ...] = ()  # a multipart body, parsed
    audio_seconds: float | None = None  # a WAV upload's own length


def _field(parts: list[Part], name: str) -> str | None:
    part = next((p for p in parts if p.name == name and p.filename is None), None)
    return part.data.decode("utf-8", "replace").strip() if part is not None else None


def parse_request(endpoint: Endpoint, body: bytes, content_type: str | None, limits: MultipartLimits) -> MediaRequest:
    """ClientError (400, 413) for anything OpenAI would refuse in the same way."""
    if not endpoint.multipart:
        obj = load_object(body)
        model = obj.get("model")
        if model is None and endpoint.kind == "moderations":
            model = ""  # optional in OpenAI's API (its default model): the flow names the caller's own
        elif type(model) is not str or not model:
            raise ClientError("model is required and must be a non-empty string")
        assert isinstance(model, str)
        if endpoint.kind == "moderations":
            return MediaRequest(endpoint, model, False, float(moderation_chars(obj.get("input"))), json=obj)
        if endpoint.kind == "audio.speech":
            text = obj.get("input")
            if type(text) is not str or not text:
                raise ClientError("input is required and must be a non-empty string")
            if len(text) > _MAX_SPEECH_CHARS:
                raise ClientError(f"input is longer than {_MAX_SPEECH_CHARS} characters")
            return MediaRequest(endpoint, model, obj.get("stream_format") == "sse", float(len(text)), json=obj)
        prompt = obj.get("prompt")
        if type(prompt) is not str or not prompt:
            raise ClientError("prompt is required and must be a non-empty string")
        n = obj.get("n", 1)
        if type(n) is not int or not 1 <= n <= _MAX_IMAGES:
            raise ClientError(f"n must be a whole number from 1 to {_MAX_IMAGES}")
        return MediaRequest(endpoint, model, bool(obj.get("stream")), float(n), json=obj)
    parts = parse_multipart(body, content_type, limits)
    model = _field(parts, "model")
    if not model:
        raise ClientError("a multipart field named `model` is required")
    files = "image" if endpoint.kind == "images.edits" else "file"
    uploads = [p for p in parts if p.filename is not None and (p.name == files or p.name == files + "[]")]
    if not uploads:
        raise ClientError(f"a multipart file part named `{files}` is required")
    if endpoint.kind == "images.edits":
        if not _field(parts, "prompt"):
            raise ClientError("a multipart field named `prompt` is required")
        raw_n = _field(parts, "n") or "1"
        if not raw_n.isdigit() or not 1 <= int(raw_n) <= _MAX_IMAGES:
            raise ClientError(f"n must be a whole number from 1 to {_MAX_IMAGES}")
        return MediaRequest(endpoint, model, (_field(parts, "stream") or "") == "true", float(raw_n),
                            parts=tuple(parts))
    seconds = wav_seconds(uploads[0].data)
    return MediaRequest(endpoint, model, (_field(parts, "stream") or "") == "true", 0.0, parts=tuple(parts),
                        audio_seconds=seconds)


def moderation_chars(value: object) -> int:
    """The characters of a moderation `input`: a string, strings, or parts (`{"type": "text", "text"}`
    and `image_url`, which count none); ClientError for anything else, as OpenAI refuses it."""
    if type(value) is str:
        items: list[object] = [value]
    elif type(value) is list and value:
        items = value
    else:
        raise ClientError("input is required: a string, an array of strings or an array of input parts")
    total = 0
    for item in items:
        if type(item) is str:
            total += len(item)
        elif isinstance(item, dict) and item.get("type") == "text" and type(item.get("text")) is str:
            total += len(item["text"])
        elif not (isinstance(item, dict) and item.get("type") == "image_url"):
            raise ClientError("input items are strings or parts of type text or image_url")
    return total


def wav_seconds(data: bytes) -> float | None:
    """A RIFF/WAVE file's length from its header (`fmt ` byte rate, `data` size); None for anything else."""
    if len(data) < 12 or data[:4] != b"RIFF" or data[8:12] != b"WAVE":
        return None
    pos, byte_rate = 12, 0
    while pos + 8 <= len(data):
        chunk, size = data[pos:pos + 4], struct.unpack_from("<I", data, pos + 4)[0]
        if chunk == b"fmt " and size >= 16 and pos + 24 <= len(data):
            byte_rate = struct.unpack_from("<I", data, pos + 16)[0]
        elif chunk == b"data":
            size = min(size, len(data) - pos - 8)  # a streamed WAV's header may claim 0xFFFFFFFF
            return size / byte_rate if byte_rate else None
        pos += 8 + size + (size & 1)
    return None


def render_body(req: MediaRequest, body: bytes, content_type: str | None, upstream_model: str) -> bytes | None:
    """The upstream body with the model renamed (or named, where the caller left it out); None when
    the caller's bytes go as they are."""
    if upstream_model == req.model and (req.json is None or "model" in req.json):
        return None
    if req.json is not None:
        return orjson.dumps({**req.json, "model": upstream_model})
    boundary = boundary_of(content_type)
    out = bytearray()
    for p in req.parts:
        data = upstream_model.encode() if p.name == "model" and p.filename is None else p.data
        out += b"--" + boundary + b"\r\n"
        for k, v in p.headers.items():
            out += f"{k}: {v}\r\n".encode()
        out += b"\r\n" + data + b"\r\n"
    out += b"--" + boundary + b"--\r\n"
    return bytes(out)


def answer_units(req: MediaRequest, body: bytes) -> float:
    """The units a successful answer bills: images in `data`; seconds from `usage` (OpenAI's
    `{"type": "duration", "seconds"}`), `duration` (verbose_json) or the WAV upload itself."""
    unit = req.endpoint.unit
    if unit == "character":
        return req.est_units
    try:
        obj = orjson.loads(body)
    except orjson.JSONDecodeError:
        obj = None  # text, srt or vtt answers
    if unit == "image":
        data = obj.get("data") if isinstance(obj, dict) else None
        return float(len(data)) if isinstance(data, list) else req.est_units
    if isinstance(obj, dict):
        usage = obj.get("usage")
        if isinstance(usage, dict) and usage.get("type") == "duration":
            seconds = usage.get("seconds")
            if isinstance(seconds, int | float) and seconds >= 0:
                return float(seconds)
        duration = obj.get("duration")
        if isinstance(duration, int | float) and duration >= 0:
            return float(duration)
    return req.audio_seconds or 0.0
