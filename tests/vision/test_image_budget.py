"""Image budgets: every header is checked, and the request admitted, before any pixel is decoded."""

from __future__ import annotations

import time
from pathlib import Path

import orjson
import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st
from PIL import Image

import extproc.flows.vision as vision_flow
from adapters.images import ImageBudget, ImageError, ImageUpload, check_images, decode_images
from contracts.config import VisionConfig, parse_config
from extproc.gateway import Gateway
from extproc.service import build_routes
from extproc.session import Session
from extproc.vision.batching import Batcher
from kernels import select_backend
from tests.core.session_driver import body_msg, headers_msg
from tests.stack_config import without_watermarks
from tests.vision.formgen import build_form
from tests.vision.imagegen import encode, png_bomb

ROOT = Path(__file__).resolve().parents[2]
ROUTES = build_routes()


@pytest.fixture
def no_decoding(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Pillow's pixel decoding, instrumented: any call is recorded and fails the request."""
    calls: list[str] = []

    def load(self: Image.Image) -> None:
        calls.append(f"{self.format} {self.size}")
        raise AssertionError("decoded")

    monkeypatch.setattr(Image.Image, "load", load)
    monkeypatch.setattr("PIL.ImageFile.ImageFile.load", load)
    return calls


def test_config_defaults_match_the_adapter() -> None:
    v, b = VisionConfig(), ImageBudget()
    assert (v.max_image_pixels, v.max_request_pixels, v.max_decoded_bytes) == (
        b.max_image_pixels, b.max_request_pixels, b.max_decoded_bytes)


def test_declared_bomb_refused_from_its_header(no_decoding: list[str]) -> None:
    with pytest.raises(ImageError) as e:
        check_images([ImageUpload(0, png_bomb(60_000, 60_000), "bomb.png")], ImageBudget())
    assert e.value.status == 413 and not no_decoding


def test_mid_size_images_over_the_request_budget(no_decoding: list[str]) -> None:
    ups = [ImageUpload(i, png_bomb(4000, 4000)) for i in range(4)]  # 16 MP each: fine alone, 64 MP together
    check_images(ups[:3], ImageBudget())
    with pytest.raises(ImageError) as e:
        check_images(ups, ImageBudget())
    assert e.value.status == 413 and "request budget" in e.value.message and not no_decoding


def test_decoded_byte_budget_counts_the_mode() -> None:
    rgba = encode((1, 2, 3, 4), (100, 100), "PNG", "RGBA")  # 4 bytes + 3 for its RGB copy per pixel
    check_images([ImageUpload(0, rgba)], ImageBudget(max_decoded_bytes=70_000))
    with pytest.raises(ImageError) as e:
        check_images([ImageUpload(0, rgba)], ImageBudget(max_decoded_bytes=69_999))
    assert e.value.status == 413 and "decode to 70000 bytes" in e.value.message


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 5000), st.integers(1, 5000)), min_size=1, max_size=8),
       st.integers(1, 60_000_000))
def test_pixel_budget_is_exact(sizes: list[tuple[int, int]], budget: int) -> None:
    ups = [ImageUpload(i, png_bomb(w, h)) for i, (w, h) in enumerate(sizes)]
    total = sum(w * h for w, h in sizes)
    try:
        check_images(ups, ImageBudget(max_images=8, max_image_pixels=10**9, max_request_pixels=budget,
                                      max_decoded_bytes=10**12))
    except ImageError as e:
        assert total > budget and e.status == 413
    else:
        assert total <= budget


def test_good_images_still_decode() -> None:
    arrs = decode_images([ImageUpload(i, encode((9, 9, 9), (8, 6))) for i in range(3)], max_images=3)
    assert [a.shape for a in arrs] == [(6, 8, 3)] * 3


# ---------------------------------------------------------------- through a Session


@pytest.fixture
def vision_gateway() -> Gateway:
    data = without_watermarks(yaml.safe_load((ROOT / "modelyard.yaml").read_text()))
    return Gateway.build(parse_config(data), batcher=Batcher(), image_backend=select_backend("cpu"))


async def _classify(gw: Gateway, images: list[bytes]):
    body, ctype = build_form([("model", "demo-colors", None, None),
                              *[("image", data, f"i{i}.png", "image/png") for i, data in enumerate(images)]])
    s = Session(gw, ROUTES)
    await s.handle(headers_msg({":method": "POST", ":path": "/v1/images/classify", "content-type": ctype,
                                "authorization": "Bearer sk-modelyard-demo"}))
    t = time.perf_counter()
    r = await s.handle(body_msg(body))
    elapsed = time.perf_counter() - t
    s.close()
    return r, elapsed


@pytest.mark.parametrize("images", [
    [png_bomb(60_000, 60_000)],
    [encode((1, 1, 1), (8, 8))] * 3 + [png_bomb(60_000, 60_000)],
    [png_bomb(4000, 4000)] * 30,  # 480 MP in total, each under the per-image limit
], ids=["bomb", "bomb-last", "many-mid-size"])
async def test_session_refuses_before_routing_or_decoding(vision_gateway: Gateway, no_decoding: list[str],
                                                          monkeypatch: pytest.MonkeyPatch, images) -> None:
    admitted: list[str] = []
    real_admit = vision_gateway.dispatcher.admit

    async def admit(ctx, choice, est):  # noqa: ANN001
        admitted.append(choice.deployment.cluster)
        await real_admit(ctx, choice, est)

    monkeypatch.setattr(vision_gateway.dispatcher, "admit", admit)
    r, elapsed = await _classify(vision_gateway, images)
    assert r.immediate_response.status.code == 413
    assert "error" in orjson.loads(r.immediate_response.body)  # the OpenAI shape the classify route speaks
    assert not no_decoding and not admitted
    print(f"refused in {elapsed * 1000:.1f} ms")
    assert elapsed < 1.0  # ~2 ms unloaded; generous for a loaded 2-core box


async def test_session_admits_before_decoding(vision_gateway: Gateway, monkeypatch: pytest.MonkeyPatch) -> None:
    order: list[str] = []
    real_admit, real_decode = vision_gateway.dispatcher.admit, vision_flow.decode_checked

    async def admit(ctx, choice, est):  # noqa: ANN001
        order.append("admit")
        await real_admit(ctx, choice, est)

    def decode(uploads, budget):  # noqa: ANN001
        order.append("decode")
        return real_decode(uploads, budget)

    monkeypatch.setattr(vision_gateway.dispatcher, "admit", admit)
    monkeypatch.setattr(vision_flow, "decode_checked", decode)
    monkeypatch.setattr(vision_flow._VisionFlow, "_policy", lambda self: None)  # its own call, no batch wait
    r, _ = await _classify(vision_gateway, [encode((255, 0, 0), (9, 9))])
    assert r.WhichOneof("response") == "request_body" and order == ["admit", "decode"]


async def test_corrupt_pixels_after_a_valid_header_are_400(vision_gateway: Gateway) -> None:
    good = encode((255, 0, 0), (64, 64))
    r, _ = await _classify(vision_gateway, [good[: len(good) // 2]])
    assert r.immediate_response.status.code == 400
