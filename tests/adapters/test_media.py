"""OpenAI's image and audio requests, pure: what each asks, the body renamed for the upstream,
and the units an answer bills."""

from __future__ import annotations

import dataclasses

import orjson
import pytest

from adapters.media import ENDPOINTS, answer_units, parse_request, render_body, wav_seconds
from adapters.multipart import MultipartLimits, parse_multipart
from contracts.errors import ClientError
from devstack.demo.media import wav

LIMITS = MultipartLimits()
CT = "multipart/form-data; boundary=XyZ"


def _form(*fields: tuple[str, bytes, str | None]) -> bytes:
    out = b""
    for name, data, filename in fields:
        disp = f'form-data; name="{name}"' + (f'; filename="{filename}"' if filename else "")
        out += b"--XyZ\r\ncontent-disposition: " + disp.encode() + b"\r\n\r\n" + data + b"\r\n"
    return out + b"--XyZ--\r\n"


def test_generations_and_speech_know_their_units_from_the_request() -> None:
    gen = parse_request(ENDPOINTS["/v1/images/generations"], b'{"model": "m", "prompt": "p", "n": 3}', None, LIMITS)
    assert (gen.model, gen.est_units, gen.endpoint.unit) == ("m", 3.0, "image")
    speech = parse_request(ENDPOINTS["/v1/audio/speech"], b'{"model": "t", "input": "hello", "voice": "a"}', None,
                           LIMITS)
    assert (speech.est_units, speech.endpoint.unit, answer_units(speech, b"\xff\xfb")) == (5.0, "character", 5.0)


@pytest.mark.parametrize(("path", "body"), [
    ("/v1/images/generations", b'{"prompt": "p"}'), ("/v1/images/generations", b'{"model": "m"}'),
    ("/v1/images/generations", b'{"model": "m", "prompt": "p", "n": 11}'),
    ("/v1/images/generations", b'{"model": "m", "prompt": "p", "n": "2"}'),
    ("/v1/audio/speech", b'{"model": "m", "input": ""}'), ("/v1/audio/speech", b"[1]"),
    ("/v1/audio/speech", b'{"model": "m", "input": "' + b"x" * 4097 + b'"}'),
])
def test_bad_json_requests_are_400(path: str, body: bytes) -> None:
    with pytest.raises(ClientError) as e:
        parse_request(ENDPOINTS[path], body, None, LIMITS)
    assert e.value.status == 400


def test_multipart_requests_need_their_file_and_model() -> None:
    ep = ENDPOINTS["/v1/audio/transcriptions"]
    clip = wav(bytes(16000 * 2 * 2), 16000)
    req = parse_request(ep, _form(("model", b"w", None), ("file", clip, "a.wav")), CT, LIMITS)
    assert req.model == "w" and req.audio_seconds == pytest.approx(2.0)
    for form in (_form(("file", clip, "a.wav")), _form(("model", b"w", None)), _form(("model", b"w", None),
                                                                                     ("file", clip, None))):
        with pytest.raises(ClientError):
            parse_request(ep, form, CT, LIMITS)
    edits = ENDPOINTS["/v1/images/edits"]
    req = parse_request(edits, _form(("model", b"i", None), ("image", b"png", "x.png"), ("prompt", b"p", None),
                                     ("n", b"2", None)), CT, LIMITS)
    assert req.est_units == 2.0
    with pytest.raises(ClientError):
        parse_request(edits, _form(("model", b"i", None), ("image", b"png", "x.png")), CT, LIMITS)  # no prompt


def test_the_upstream_body_is_the_callers_with_the_model_renamed() -> None:
    ep = ENDPOINTS["/v1/audio/transcriptions"]
    body = _form(("model", b"gw-name", None), ("file", b"\x00\x01", "a.wav"), ("language", b"en", None))
    req = parse_request(ep, body, CT, LIMITS)
    assert render_body(req, body, CT, "gw-name") is None  # same name: the caller's bytes go as sent
    renamed = render_body(req, body, CT, "whisper-1")
    assert renamed is not None
    parts = parse_multipart(renamed, CT)
    assert [(p.name, p.data, p.filename) for p in parts] == [("model", b"whisper-1", None),
                                                             ("file", b"\x00\x01", "a.wav"), ("language", b"en", None)]
    gen = parse_request(ENDPOINTS["/v1/images/generations"], b'{"model": "a", "prompt": "p"}', None, LIMITS)
    assert orjson.loads(render_body(gen, b"", None, "dall-e-3") or b"") == {"model": "dall-e-3", "prompt": "p"}


def test_a_moderation_may_leave_its_model_out_and_goes_upstream_named() -> None:
    ep = ENDPOINTS["/v1/moderations"]
    req = parse_request(ep, b'{"input": "hello"}', None, LIMITS)
    assert (req.model, req.est_units) == ("", 5.0)  # the flow names the caller's own moderation model
    named = dataclasses.replace(req, model="mod")
    assert orjson.loads(render_body(named, b"", None, "mod") or b"") == {"input": "hello", "model": "mod"}
    with pytest.raises(ClientError):
        parse_request(ep, b'{"model": "", "input": "hello"}', None, LIMITS)  # named, it must be a name
    with pytest.raises(ClientError):
        parse_request(ENDPOINTS["/v1/audio/speech"], b'{"input": "hello", "voice": "a"}', None, LIMITS)


def test_answer_units() -> None:
    gen = parse_request(ENDPOINTS["/v1/images/generations"], b'{"model": "a", "prompt": "p", "n": 4}', None, LIMITS)
    assert answer_units(gen, b'{"data": [{"url": "x"}, {"url": "y"}]}') == 2.0  # what came back
    assert answer_units(gen, b"not json") == 4.0
    ep = ENDPOINTS["/v1/audio/transcriptions"]
    req = parse_request(ep, _form(("model", b"w", None), ("file", wav(bytes(8000), 8000), "a.wav")), CT, LIMITS)
    assert answer_units(req, b'{"text": "t", "usage": {"type": "duration", "seconds": 7}}') == 7.0
    assert answer_units(req, b'{"text": "t", "duration": 2.5}') == 2.5
    assert answer_units(req, b"plain text") == pytest.approx(0.5)  # the WAV upload's own length
    assert wav_seconds(b"ID3 not a wav") is None and wav_seconds(b"RIFF\x00\x00\x00\x00WAVE") is None
