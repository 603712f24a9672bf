"""OpenAI's image and audio endpoints on the demo OpenAI server, answering as OpenAI documents
them: `demo-image` (generations, edits: `b64_json` or `url`), `demo-whisper` (transcriptions and
translations: json, text, verbose_json, srt, vtt; `usage` in seconds), `demo-tts` (speech: audio
bytes sent in chunks, mp3 as silent MPEG frames, wav and pcm as silence).
"""

from __future__ import annotations

import asyncio
import base64
import struct
import time
import zlib
from collections.abc import Awaitable, Callable

from aiohttp import web

from adapters.media import wav_seconds

IMAGE_PATH = "/demo-image.png"


def _png(width: int = 8, height: int = 8) -> bytes:
    """A small solid PNG (the demo's image, whatever the prompt)."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))
    rows = b"".join(b"\x00" + b"\x4c\x8b\xf5" * width for _ in range(height))
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(rows)) + chunk(b"IEND", b""))


PNG = _png()
# One MPEG-1 Layer III frame, 128 kb/s, 44.1 kHz, no padding: 417 bytes, 1152 samples of silence.
_MP3_FRAME = b"\xff\xfb\x90\x64" + bytes(413)
_MP3_FRAME_S = 1152 / 44100
_SPEECH_CHARS_PER_S = 15.0  # how long the demo "speaks" a text
_SPEECH_CHUNKS = 4
_CONTENT_TYPES = {"mp3": "audio/mpeg", "wav": "audio/wav", "pcm": "audio/pcm", "opus": "audio/ogg",
                  "aac": "audio/aac", "flac": "audio/flac"}


def _error(status: int, message: str) -> web.Response:
    return web.json_response({"error": {"message": message, "type": "invalid_request_error", "param": None,
                                        "code": None}}, status=status)


def _images(request: web.Request, n: int, fmt: str, prompt: str) -> web.Response:
    # The demo's own address, not the Host header (the gateway's): OpenAI's links point at its own store.
    sock = request.transport.get_extra_info("sockname") if request.transport is not None else None
    where = f"{sock[0]}:{sock[1]}" if sock else request.host
    item = ({"b64_json": base64.b64encode(PNG).decode()} if fmt == "b64_json"
            else {"url": f"http://{where}{IMAGE_PATH}"})
    return web.json_response({"created": int(time.time()), "data": [{**item, "revised_prompt": prompt}] * n,
                              "usage": {"input_tokens": len(prompt) // 4, "output_tokens": 0,
                                        "total_tokens": len(prompt) // 4}})


def add_media_routes(app: web.Application, prefix: str) -> None:
    """`prefix` ("[demo-whisper]") leads every text the demo answers, as its chat answers do."""
    async def generations(request: web.Request) -> web.Response:
        try:
            body = await request.json()
        except ValueError:
            return _error(400, "the body must be JSON")
        n, fmt = body.get("n", 1), body.get("response_format", "url")
        if fmt not in ("url", "b64_json"):
            return _error(400, "response_format must be url or b64_json")
        return _images(request, int(n), fmt, str(body.get("prompt", "")))

    async def edits(request: web.Request) -> web.Response:
        form = await request.post()
        if "image" not in form and "image[]" not in form:
            return _error(400, "image is required")
        fmt = str(form.get("response_format", "url"))
        return _images(request, int(str(form.get("n", "1"))), fmt, str(form.get("prompt", "")))

    async def image(_: web.Request) -> web.Response:
        return web.Response(body=PNG, content_type="image/png")

    def transcribe(task: str) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
        async def handler(request: web.Request) -> web.StreamResponse:
            form = await request.post()
            upload = form.get("file")
            if not isinstance(upload, web.FileField):
                return _error(400, "file is required")
            data = upload.file.read()
            seconds = wav_seconds(data) or round(len(data) / 32000, 2)  # 16 kHz 16-bit mono, else
            verb = "transcript" if task == "transcribe" else "translation"
            text = f"{prefix} {verb} of {upload.filename} ({seconds:.2f} s)"
            fmt = str(form.get("response_format", "json"))
            if fmt == "text":
                return web.Response(text=text + "\n")
            if fmt in ("srt", "vtt"):
                end = f"00:00:{min(seconds, 59.999):06.3f}"
                if fmt == "vtt":
                    return web.Response(text=f"WEBVTT\n\n00:00:00.000 --> {end}\n{text}\n")
                return web.Response(text=f"1\n00:00:00,000 --> {end.replace('.', ',')}\n{text}\n")
            usage = {"type": "duration", "seconds": round(seconds)}
            if fmt == "verbose_json":
                return web.json_response({"task": task, "language": str(form.get("language", "english")),
                                          "duration": seconds, "text": text, "segments": [], "usage": usage})
            return web.json_response({"text": text, "usage": usage} if task == "transcribe" else {"text": text})
        return handler

    async def speech(request: web.Request) -> web.StreamResponse:
        try:
            body = await request.json()
        except ValueError:
            return _error(400, "the body must be JSON")
        text, fmt = str(body.get("input", "")), body.get("response_format", "mp3")
        if fmt not in _CONTENT_TYPES:
            return _error(400, f"response_format must be one of {', '.join(_CONTENT_TYPES)}")
        seconds = max(len(text) / _SPEECH_CHARS_PER_S, 0.1)
        audio = _audio(fmt, seconds)
        resp = web.StreamResponse(headers={"content-type": _CONTENT_TYPES[fmt]})
        resp.enable_chunked_encoding()
        await resp.prepare(request)
        step = -(-len(audio) // _SPEECH_CHUNKS)
        for i in range(0, len(audio), step):  # audio comes as it is made, not all at once
            await resp.write(audio[i:i + step])
            await asyncio.sleep(0)
        await resp.write_eof()
        return resp

    app.router.add_post("/v1/images/generations", generations)
    app.router.add_post("/v1/images/edits", edits)
    app.router.add_get(IMAGE_PATH, image)
    app.router.add_post("/v1/audio/transcriptions", transcribe("transcribe"))
    app.router.add_post("/v1/audio/translations", transcribe("translate"))
    app.router.add_post("/v1/audio/speech", speech)


def _audio(fmt: str, seconds: float) -> bytes:
    if fmt == "mp3":
        return _MP3_FRAME * max(1, round(seconds / _MP3_FRAME_S))
    pcm = bytes(int(24000 * seconds) * 2)  # 24 kHz 16-bit mono silence, as OpenAI's pcm is
    if fmt == "pcm":
        return pcm
    return wav(pcm, 24000)  # wav, and the formats the demo does not encode (said by content-type only)


def wav(pcm: bytes, rate: int) -> bytes:
    """16-bit mono PCM in a RIFF/WAVE container."""
    return (b"RIFF" + struct.pack("<I", 36 + len(pcm)) + b"WAVEfmt " + struct.pack("<IHHIIHH", 16, 1, 1, rate,
            rate * 2, 2, 16) + b"data" + struct.pack("<I", len(pcm)) + pcm)
