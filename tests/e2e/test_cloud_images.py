"""OpenAI image generation translated for Imagen on Vertex AI, Gemini's image output and Titan Image
on Bedrock, through a real Envoy with the openai SDK, against the demo clouds (`demo-imagen`,
`demo-gemini-image`, `demo-titan-image`): the demo Vertex checks the OAuth2 token and Imagen's
`:predict` shape, the demo Gemini its API key and generateContent's image request, the demo Bedrock
the SigV4 signature and Titan's InvokeModel shape; each call metered per image. One stack for the
module.
"""

from __future__ import annotations

import base64
import os
import sqlite3
import time

import openai
import pytest

from devstack.demo.media import PNG
from tests.conftest import DEMO_KEY, UPSTREAM_KEYS
from tests.stack_config import demo_config_free_ports, start_stack

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory):
    workdir = tmp_path_factory.mktemp("cloud-images")
    data, _ = demo_config_free_ports()
    keep = ("demo-imagen", "demo-titan-image", "demo-gemini-image")
    data["models"] = [m for m in data["models"] if m["name"] in keep]
    for m in data["models"]:
        for d in m["deployments"]:  # the demos write their credentials into this stack's own run dir
            for section in ("vertex", "bedrock"):
                if section in d and d[section].get("credentials_file"):
                    d[section]["credentials_file"] = str(workdir / os.path.basename(d[section]["credentials_file"]))
    for name, value in UPSTREAM_KEYS.items():
        os.environ.setdefault(name, value)
    with start_stack(workdir, data, shared_demos=True) as s:
        yield s


def _oai(stack) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{stack.url}/v1", api_key=DEMO_KEY, max_retries=0)


def _metered(stack, task_id: str) -> tuple[str, int, float]:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        with sqlite3.connect(stack.cfg.extproc.metering_db) as db:
            row = db.execute("SELECT model, status, cost FROM requests WHERE task_id = ?", (task_id,)).fetchone()
        if row:
            return row
        time.sleep(0.1)
    raise AssertionError(f"no metering row for {task_id}")


@pytest.mark.parametrize(("model", "size", "n", "per_image"), [("demo-imagen", "1024x768", 2, 0.04),
                                                               ("demo-titan-image", "512x512", 2, 0.01),
                                                               ("demo-gemini-image", "1536x1024", 1, 0.039)])
def test_generations_are_translated_and_metered_per_image(stack, model: str, size: str, n: int,
                                                          per_image: float) -> None:
    raw = _oai(stack).images.with_raw_response.generate(model=model, prompt="a lighthouse", n=n, size=size,  # type: ignore[arg-type]
                                                        response_format="b64_json")
    img = raw.parse()
    assert [base64.b64decode(d.b64_json or "") for d in img.data or []] == [PNG] * n
    assert img.created > 0
    task_id = raw.headers["x-modelyard-task-id"]
    got_model, status, cost = _metered(stack, task_id)
    assert (got_model, status) == (model, 200)
    assert cost == pytest.approx(n * per_image)


@pytest.mark.parametrize(("model", "fields", "why"), [
    ("demo-imagen", {"n": 5}, "at most 4"), ("demo-imagen", {"size": "1792x1024"}, "aspect ratio"),
    ("demo-titan-image", {"response_format": "url"}, "b64_json"), ("demo-titan-image", {"quality": "low"}, "quality"),
    ("demo-gemini-image", {"n": 2}, "n must be 1"),
])
def test_what_does_not_map_is_a_400_in_openais_shape(stack, model: str, fields: dict[str, object], why: str) -> None:
    with pytest.raises(openai.BadRequestError, match=why) as e:
        _oai(stack).images.generate(model=model, prompt="p", **fields)  # type: ignore[arg-type]
    assert e.value.status_code == 400
    assert isinstance(e.value.body, dict) and e.value.body.get("message")
