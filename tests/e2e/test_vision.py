"""The vision path through a real Envoy: KServe v2 REST -> gRPC demo model, multipart classify, errors."""

from __future__ import annotations

import io

import httpx
import numpy as np
import pytest
from PIL import Image

from contracts.config import TensorInput
from kernels import PreprocessSpec, preprocess
from tests.conftest import DEMO_KEY
from tests.vision.formgen import build_form
from tests.vision.imagegen import encode, png_bomb

pytestmark = pytest.mark.e2e

AUTH = {"authorization": f"Bearer {DEMO_KEY}"}
LABELS = ["red", "green", "blue", "white", "black", "yellow", "cyan", "magenta"]
COLOURS = {"red": (255, 0, 0), "green": (0, 255, 0), "blue": (0, 0, 255), "yellow": (255, 255, 0),
           "white": (255, 255, 255), "black": (0, 0, 0), "cyan": (0, 255, 255), "magenta": (255, 0, 255)}
SPEC = PreprocessSpec.from_tensor_input(TensorInput(width=32, height=32, datatype="FP32"))


def _tensor(names: list[str], size: tuple[int, int] = (20, 12)) -> np.ndarray:
    return preprocess([np.full((size[1], size[0], 3), COLOURS[n], np.uint8) for n in names], SPEC)


def _v2_body(x: np.ndarray, **extra: object) -> dict:
    return {"inputs": [{"name": "input", "datatype": "FP32", "shape": list(x.shape), "data": x.ravel().tolist()}],
            **extra}


def _classify(url: str, fields: list, **kw: object) -> httpx.Response:
    body, ctype = build_form(fields)
    return httpx.post(f"{url}/v1/images/classify", content=body, headers={**AUTH, "content-type": ctype},
                      timeout=20, **kw)


def _files(specs: list[tuple[str, str, tuple[int, int]]]) -> list:
    mime = {"PNG": "image/png", "JPEG": "image/jpeg", "WEBP": "image/webp"}
    return [("image", encode(COLOURS[c], size, fmt), f"{c}.{fmt.lower()}", mime[fmt]) for c, fmt, size in specs]


# ---------------------------------------------------------------- KServe v2 REST -> gRPC


def test_v2_infer_round_trip(demo_stack) -> None:
    names = ["red", "blue", "yellow"]
    x = _tensor(names)
    r = httpx.post(f"{demo_stack.url}/v2/models/demo-colors/infer", json=_v2_body(x, id="req-7"), headers=AUTH,
                   timeout=20)
    assert r.status_code == 200, r.text
    assert r.headers["content-type"] == "application/json"
    assert r.headers["x-modelyard-cluster"] == "demo-kserve"
    doc = r.json()
    assert doc["model_name"] == "demo-colors" and doc["id"] == "req-7"
    out = {o["name"]: o for o in doc["outputs"]}["scores"]
    assert out["datatype"] == "FP32" and out["shape"] == [3, len(LABELS)]
    scores = np.array(out["data"]).reshape(out["shape"])
    assert [LABELS[i] for i in scores.argmax(1)] == names
    assert "grpc-status" not in r.headers


def test_v2_infer_with_version_and_outputs(demo_stack) -> None:
    x = _tensor(["green"])
    r = httpx.post(f"{demo_stack.url}/v2/models/demo-colors/versions/1/infer",
                   json=_v2_body(x, outputs=[{"name": "scores"}]), headers=AUTH, timeout=20)
    assert r.status_code == 200, r.text
    scores = np.array(r.json()["outputs"][0]["data"])
    assert LABELS[int(scores.argmax())] == "green"


@pytest.mark.parametrize("code,status", [(3, 400), (5, 404), (14, 503), (4, 504), (8, 429), (13, 502),
                                         (12, 501), (7, 403)])
def test_grpc_status_mapped(demo_stack, code: int, status: int) -> None:
    x = _tensor(["red"])
    r = httpx.post(f"{demo_stack.url}/v2/models/demo-colors/infer",
                   json=_v2_body(x, parameters={"demo_fail_code": code}), headers=AUTH, timeout=20)
    assert r.status_code == status, r.text
    assert r.json()["error"] == "demo: forced failure"
    assert "x-modelyard-task-id" in r.headers


def test_unknown_output_is_invalid_argument(demo_stack) -> None:
    x = _tensor(["red"])
    r = httpx.post(f"{demo_stack.url}/v2/models/demo-colors/infer",
                   json=_v2_body(x, outputs=[{"name": "logits"}]), headers=AUTH, timeout=20)
    assert r.status_code == 400 and "logits" in r.json()["error"]


@pytest.mark.parametrize("body,fragment", [
    (b"{not json", "not valid JSON"),
    (b'{"inputs": []}', "non-empty"),
    (b'{"inputs": [{"name": "input", "datatype": "FP32", "shape": [1, 3, 2, 2], "data": [1, 2]}]}', "holds 12"),
    (b'{"inputs": [{"name": "input", "datatype": "FP99", "shape": [1], "data": [1]}]}', "unsupported datatype"),
    (b'{"inputs": [{"name": "input", "datatype": "FP32", "shape": [2], "data": ["a", "b"]}]}', "numbers"),
], ids=["not-json", "no-inputs", "data-short-of-shape", "unknown-datatype", "strings-as-fp32"])
def test_malformed_v2_json(demo_stack, body: bytes, fragment: str) -> None:
    r = httpx.post(f"{demo_stack.url}/v2/models/demo-colors/infer", content=body,
                   headers={**AUTH, "content-type": "application/json"}, timeout=20)
    assert r.status_code == 400, r.text
    assert fragment in r.json()["error"]


def test_v2_unknown_model_and_no_key(demo_stack) -> None:
    x = _tensor(["red"])
    r = httpx.post(f"{demo_stack.url}/v2/models/nope/infer", json=_v2_body(x), headers=AUTH, timeout=20)
    assert r.status_code == 404 and "error" in r.json()
    r = httpx.post(f"{demo_stack.url}/v2/models/demo-colors/infer", json=_v2_body(x), timeout=20)
    assert r.status_code == 401


def test_v2_metadata_and_model_list(demo_stack) -> None:
    # The upstream's own metadata (the demo server takes any image size), under the gateway's name.
    r = httpx.get(f"{demo_stack.url}/v2/models/demo-colors", headers=AUTH, timeout=10)
    assert r.status_code == 200, r.text
    doc = r.json()
    assert doc["name"] == "demo-colors" and doc["platform"] == "modelyard-demo"
    assert doc["inputs"] == [{"name": "input", "datatype": "FP32", "shape": [-1, 3, -1, -1]}]
    assert doc["outputs"] == [{"name": "scores", "datatype": "FP32", "shape": [-1, len(LABELS)]}]
    r = httpx.get(f"{demo_stack.url}/v2/models/demo-colors/ready", headers=AUTH, timeout=10)
    assert r.status_code == 200 and r.json() == {"name": "demo-colors", "ready": True}
    r = httpx.get(f"{demo_stack.url}/v1/models", headers=AUTH, timeout=10)
    assert "demo-colors" in {m["id"] for m in r.json()["data"]}


# ---------------------------------------------------------------- multipart classify


def test_classify_mixed_formats_in_order(demo_stack) -> None:
    specs = [("red", "PNG", (64, 48)), ("green", "JPEG", (17, 31)), ("blue", "WEBP", (300, 200)),
             ("yellow", "PNG", (5, 5)), ("magenta", "JPEG", (128, 64)), ("cyan", "WEBP", (33, 90)),
             ("white", "PNG", (40, 40)), ("black", "JPEG", (90, 20))]
    r = _classify(demo_stack.url, [("model", "demo-colors", None, None), *_files(specs), ("top_k", "3", None, None)])
    assert r.status_code == 200, r.text
    doc = r.json()
    assert doc["model"] == "demo-colors"
    assert [row["index"] for row in doc["results"]] == list(range(len(specs)))
    assert [row["filename"] for row in doc["results"]] == [f"{c}.{f.lower()}" for c, f, _ in specs]
    assert [row["labels"][0]["label"] for row in doc["results"]] == [c for c, _, _ in specs]
    assert all(len(row["labels"]) == 3 for row in doc["results"])
    assert r.headers["x-modelyard-model"] == "demo-colors"


def test_classify_default_top_k(demo_stack) -> None:
    r = _classify(demo_stack.url, [("model", "demo-colors", None, None), *_files([("blue", "PNG", (8, 8))])])
    assert r.status_code == 200, r.text
    labels = r.json()["results"][0]["labels"]
    assert len(labels) == 5 and labels[0] == {"label": "blue", "score": 1.0}


def _gif() -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (8, 8), (255, 0, 0)).save(buf, "GIF")
    return buf.getvalue()


BAD_FORMS = {
    "corrupt": ([("model", "demo-colors", None, None), ("image", encode()[:40] + b"\x00" * 30, "x.png", None)], 400,
                "image 0"),
    "truncated_jpeg": ([("model", "demo-colors", None, None), ("image", encode(fmt="JPEG", size=(64, 64))[:200],
                                                                "t.jpg", None)], 400, "image 0"),
    "not_an_image": ([("model", "demo-colors", None, None), ("image", b"%PDF-1.4 hello", "doc.pdf", None)], 400,
                     "not a recognised image"),
    "gif": ([("model", "demo-colors", None, None), ("image", _gif(), "a.gif", "image/gif")], 400, "GIF"),
    "zero_images": ([("model", "demo-colors", None, None)], 400, "no images"),
    "too_many": ([("model", "demo-colors", None, None)] + [("image", encode(size=(4, 4)), f"{i}.png", None)
                                                            for i in range(33)], 413, "exceed the maximum"),
    "bomb": ([("model", "demo-colors", None, None), ("image", png_bomb(50_000, 50_000), "bomb.png", None)], 413,
             "exceed"),
    "no_model": ([("image", encode(), "r.png", None)], 400, "'model' is required"),
    "unknown_model": ([("model", "nope", None, None), ("image", encode(), "r.png", None)], 404, "does not exist"),
    "not_vision": ([("model", "demo-gpt", None, None), ("image", encode(), "r.png", None)], 400, "classify images"),
    "bad_top_k": ([("model", "demo-colors", None, None), ("image", encode(), "r.png", None),
                   ("top_k", "many", None, None)], 400, "top_k"),
}


@pytest.mark.parametrize("case", sorted(BAD_FORMS))
def test_classify_bad_input(demo_stack, case: str) -> None:
    fields, status, fragment = BAD_FORMS[case]
    r = _classify(demo_stack.url, fields)
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert fragment in err["message"], err
    assert "x-modelyard-task-id" in r.headers


@pytest.mark.parametrize("ctype,body", [("application/json", b'{"model": "demo-colors"}'),
                                        ("multipart/form-data", b"--x\r\n"),
                                        ("multipart/form-data; boundary=abc", b"--abc\r\nnot a part")], ids=[
    "json", "multipart-no-boundary", "multipart-no-part"
])
def test_classify_wrong_content_type_or_framing(demo_stack, ctype: str, body: bytes) -> None:
    r = httpx.post(f"{demo_stack.url}/v1/images/classify", content=body, headers={**AUTH, "content-type": ctype},
                   timeout=20)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["message"]


def test_service_keeps_serving_after_bad_input(demo_stack) -> None:
    for fields, _, _ in BAD_FORMS.values():
        _classify(demo_stack.url, fields)
    r = _classify(demo_stack.url, [("model", "demo-colors", None, None), *_files([("cyan", "WEBP", (10, 10))])])
    assert r.status_code == 200 and r.json()["results"][0]["labels"][0]["label"] == "cyan"
