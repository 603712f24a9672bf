"""OpenAI image generation translated for Imagen on Vertex AI (`:predict`) and Titan Image on
Bedrock (InvokeModel), against the providers' documented shapes and a recorded Imagen answer
(recorded/SOURCES.md): what maps, what is refused (400 before any upstream call), SigV4 as the
demo Bedrock verifies it."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest

from adapters import image_translation
from adapters.bedrock import images as titan
from adapters.bedrock.signing import verify
from adapters.cloud_targets import AwsCredentials, BedrockTarget, VertexTarget
from adapters.image_generation import parse_ask
from adapters.vertex import images as imagen
from contracts.errors import ClientError, UpstreamError

RECORDED = Path(__file__).parent / "recorded"
VERTEX = VertexTarget("proj", "us-central1")
CREDS = AwsCredentials("AKIDEXAMPLE", "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY")
BEDROCK = BedrockTarget("us-east-1", "bedrock-runtime.us-east-1.amazonaws.com", CREDS)


def _ask(**fields: object) -> dict[str, object]:
    return {"model": "m", "prompt": "a lighthouse at dusk", **fields}


# -- Imagen -----------------------------------------------------------------------------------------
@pytest.mark.parametrize(("fields", "parameters"), [
    ({}, {"sampleCount": 1, "outputOptions": {"mimeType": "image/png"}}),
    ({"n": 3, "size": "1024x1024"}, {"sampleCount": 3, "aspectRatio": "1:1", "outputOptions": {"mimeType": "image/png"}}),
    ({"size": "1024x768", "output_format": "jpeg", "response_format": "b64_json", "user": "u1", "quality": "auto"},
     {"sampleCount": 1, "aspectRatio": "4:3", "outputOptions": {"mimeType": "image/jpeg"}}),
    ({"size": "768x1366"}, None),  # 384:683: no Imagen ratio
])
def test_imagen_request_maps_n_size_and_format(fields: dict[str, object], parameters: object) -> None:
    obj = _ask(**fields)
    if parameters is None:
        with pytest.raises(ClientError, match="aspect ratio"):
            image_translation.render_request("vertex", obj, upstream_model="imagen-3.0-generate-002",
                                             credential="tok", cloud=VERTEX)
        return
    up, _, kind = image_translation.render_request("vertex", obj, upstream_model="imagen-3.0-generate-002",
                                                   credential="tok", cloud=VERTEX)
    assert kind == "imagen"
    assert up.path == ("/v1/projects/proj/locations/us-central1/publishers/google/models/"
                       "imagen-3.0-generate-002:predict")
    assert up.headers["authorization"] == "Bearer tok"
    assert orjson.loads(up.body) == {"instances": [{"prompt": "a lighthouse at dusk"}], "parameters": parameters}


@pytest.mark.parametrize(("fields", "why"), [
    ({"n": 5}, "at most 4"), ({"response_format": "url"}, "b64_json"), ({"quality": "hd"}, "quality"),
    ({"output_format": "webp"}, "output_format"), ({"style": "vivid"}, "style"), ({"stream": True}, "stream"),
    ({"size": "big"}, "WIDTHxHEIGHT"),
])
def test_imagen_refuses_what_does_not_map(fields: dict[str, object], why: str) -> None:
    with pytest.raises(ClientError, match=why) as e:
        image_translation.render_request("vertex", _ask(**fields), upstream_model="i", credential="t", cloud=VERTEX)
    assert e.value.status == 400


def test_imagen_claude_publisher_is_refused() -> None:
    with pytest.raises(ClientError, match="Google's"):
        image_translation.render_request("vertex", _ask(), upstream_model="c", credential="t",
                                         cloud=VertexTarget("p", "us-east5", "anthropic"))


def test_imagen_answer_keeps_bytes_and_revised_prompt_and_skips_filtered() -> None:
    body = orjson.dumps({"predictions": [
        {"bytesBase64Encoded": "QUJD", "mimeType": "image/png", "prompt": "an enhanced prompt"},
        {"bytesBase64Encoded": "REVG", "mimeType": "image/png"},
        {"raiFilteredReason": "filtered"}]})
    ask = parse_ask(_ask(n=3), "Imagen")
    answer = orjson.loads(image_translation.render_answer("imagen", body, ask, 1700000000))
    assert answer == {"created": 1700000000, "output_format": "png", "data": [
        {"b64_json": "QUJD", "revised_prompt": "an enhanced prompt"}, {"b64_json": "REVG"}]}


def test_recorded_imagen_answer_without_inline_bytes_gives_no_images() -> None:
    # Recorded: images stored to Cloud Storage and two filtered; the gateway never asks for storageUri,
    # so no inline bytes means no image to return (and none billed).
    body = (RECORDED / "imagen-generate-images-gcs-some-filtered.json").read_bytes()
    assert imagen.parse_answer(body, 1, "jpeg")["data"] == []


def test_imagen_answer_of_another_shape_is_an_upstream_error() -> None:
    with pytest.raises(UpstreamError):
        imagen.parse_answer(b"<html>", 1, "png")
    with pytest.raises(UpstreamError):
        imagen.parse_answer(b'{"predictions": {}}', 1, "png")


# -- Titan Image ------------------------------------------------------------------------------------
@pytest.mark.parametrize(("fields", "config"), [
    ({}, {"numberOfImages": 1}),
    ({"n": 2, "size": "512x512", "quality": "hd"}, {"numberOfImages": 2, "quality": "premium", "width": 512,
                                                     "height": 512}),
    ({"size": "1152x896", "quality": "standard"}, {"numberOfImages": 1, "quality": "standard", "width": 1152,
                                                   "height": 896}),
])
def test_titan_request_maps_n_size_and_quality(fields: dict[str, object], config: object) -> None:
    up, _, _ = image_translation.render_request("bedrock", _ask(**fields),
                                                upstream_model="amazon.titan-image-generator-v2:0", credential=None,
                                                cloud=BEDROCK)
    assert up.path == "/model/amazon.titan-image-generator-v2%3A0/invoke"
    assert orjson.loads(up.body) == {"taskType": "TEXT_IMAGE", "textToImageParams": {"text": "a lighthouse at dusk"},
                                     "imageGenerationConfig": config}
    # Signed as AWS checks it (botocore's own computation, as the demo Bedrock verifies)
    assert verify("POST", up.path, up.headers, up.body, region="us-east-1", creds=CREDS) is None


@pytest.mark.parametrize(("fields", "why"), [
    ({"n": 6}, "at most 5"), ({"size": "1792x1024"}, "Titan Image's sizes"), ({"quality": "low"}, "quality"),
    ({"output_format": "jpeg"}, "PNG"), ({"response_format": "url"}, "b64_json"), ({"background": "transparent"},
                                                                                   "background"),
])
def test_titan_refuses_what_does_not_map(fields: dict[str, object], why: str) -> None:
    with pytest.raises(ClientError, match=why):
        image_translation.render_request("bedrock", _ask(**fields), upstream_model="t", credential=None, cloud=BEDROCK)


def test_titan_answer_and_its_error() -> None:
    # The documented answer: {"images": [base64 PNG, ...], "error": null}
    ask = parse_ask(_ask(n=2), "Titan Image")
    answer = orjson.loads(image_translation.render_answer("titan", b'{"images": ["QUJD", "REVG"], "error": null}',
                                                          ask, 5))
    assert answer == {"created": 5, "output_format": "png", "data": [{"b64_json": "QUJD"}, {"b64_json": "REVG"}]}
    with pytest.raises(UpstreamError, match="blocked"):
        titan.parse_answer(b'{"images": null, "error": "blocked"}', 5)


# -- Gemini image output (Gemini API, or a gemini-* model on Vertex) ---------------------------------
@pytest.mark.parametrize(("fields", "config"), [
    ({}, {"responseModalities": ["TEXT", "IMAGE"]}),
    ({"size": "1536x1024", "n": 1}, {"responseModalities": ["TEXT", "IMAGE"], "imageConfig": {"aspectRatio": "3:2"}}),
])
def test_gemini_request_on_the_gemini_api_and_on_vertex(fields: dict[str, object], config: object) -> None:
    up, _, kind = image_translation.render_request("gemini", _ask(**fields), upstream_model="gemini-2.5-flash-image",
                                                   credential="key", cloud=None)
    assert kind == "gemini" and up.path == "/v1beta/models/gemini-2.5-flash-image:generateContent"
    assert up.headers["x-goog-api-key"] == "key"
    assert orjson.loads(up.body) == {"contents": [{"role": "user", "parts": [{"text": "a lighthouse at dusk"}]}],
                                     "generationConfig": config}
    up, _, kind = image_translation.render_request("vertex", _ask(**fields), upstream_model="gemini-2.5-flash-image",
                                                   credential="tok", cloud=VERTEX)
    assert kind == "gemini" and up.path.endswith("/publishers/google/models/gemini-2.5-flash-image:generateContent")


@pytest.mark.parametrize(("fields", "why"), [({"n": 2}, "n must be 1"), ({"size": "1792x1024"}, "aspect ratio"),
                                             ({"output_format": "jpeg"}, "PNG")])
def test_gemini_refuses_what_does_not_map(fields: dict[str, object], why: str) -> None:
    with pytest.raises(ClientError, match=why):
        image_translation.render_request("gemini", _ask(**fields), upstream_model="g", credential="k", cloud=None)


def test_gemini_answer_keeps_the_image_parts_only() -> None:
    body = orjson.dumps({"candidates": [{"content": {"role": "model", "parts": [
        {"text": "Here is your lighthouse."}, {"inlineData": {"mimeType": "image/png", "data": "QUJD"}}]},
        "finishReason": "STOP"}], "usageMetadata": {"promptTokenCount": 6}})
    ask = parse_ask(_ask(), "Gemini image")
    answer = orjson.loads(image_translation.render_answer("gemini", body, ask, 9))
    assert answer == {"created": 9, "output_format": "png", "data": [{"b64_json": "QUJD"}]}


def test_other_protocols_are_not_translated() -> None:
    with pytest.raises(ClientError):
        image_translation.render_request("anthropic", _ask(), upstream_model="x", credential=None, cloud=None)
