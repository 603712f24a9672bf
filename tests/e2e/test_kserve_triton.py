"""Modelyard in front of NVIDIA Triton (nvidia-pytriton, CPU): a server that announces the binary
tensor extension, so binary REST bodies pass through as sent, and one whose replies the gateway
renames in the binary framing. tritonclient.http and tritonclient.grpc, REST and gRPC upstreams. And
KServe v2 text tensors (BYTES) of concurrent callers batched into fewer calls to Triton's `textlen`
(docs/batching.md "KServe text tensors"), counted by Triton's own metrics."""

from __future__ import annotations

import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import numpy as np
import pytest
import tritonclient.grpc as triton_grpc
import tritonclient.http as triton_http

from tests.conftest import DEMO_KEY
from tests.kserve_servers import triton_child, triton_missing
from tests.stack_config import free_port, start_stack

pytestmark = [pytest.mark.e2e, pytest.mark.skipif(triton_missing() is not None, reason=str(triton_missing()))]

AUTH = {"authorization": f"Bearer {DEMO_KEY}"}  # copied per call: tritonclient writes into it
_TENANT = {"name": "demo", "tier": "L1", "allowed_models": ["*"],
           "api_keys": ["sha256:c898d9f492d2577070136e9b8f2852e4f208ee9f1f4a5dff1385dcea7966f81e"]}
MODELS = {"doubler": "kserve-rest", "doubler-grpc": "kserve-grpc"}
TEXT_CALLERS = 8


@pytest.fixture(scope="module")
def triton_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    workdir = tmp_path_factory.mktemp("triton")
    ports = {"http": free_port(), "grpc": free_port(), "metrics": free_port()}
    models = [{"name": name, "task_types": ["infer"], "latency_ms": 20,
               "deployments": [{"cluster": f"triton-{protocol}", "protocol": protocol, "upstream_model": "double",
                                "endpoints": [f"127.0.0.1:{ports['http' if protocol == 'kserve-rest' else 'grpc']}"]}]}
              for name, protocol in MODELS.items()]
    models.append({"name": "textlen", "task_types": ["infer"], "capabilities": {"streaming": False},
                   "batching": {"max_delay_ms": 1000, "min_size": TEXT_CALLERS, "max_size": 32},
                   "deployments": [{"cluster": "triton-text", "protocol": "kserve-grpc", "upstream_model": "textlen",
                                    "endpoints": [f"127.0.0.1:{ports['grpc']}"]}]})
    # The same model on Triton's HTTP port: a KServe v2 REST deployment, its merged calls made by the extproc.
    models.append({**models[-1], "name": "textlen-rest", "deployments": [
        {"cluster": "triton-text-rest", "protocol": "kserve-rest", "upstream_model": "textlen",
         "endpoints": [f"127.0.0.1:{ports['http']}"]}]})
    data = {"listener": {"address": "127.0.0.1", "port": free_port()},
            "extproc": {"address": f"127.0.0.1:{free_port()}", "metrics_address": f"127.0.0.1:{free_port()}"},
            "models": models, "tenants": [_TENANT]}
    stack = start_stack(workdir, data, demos=False)
    stack.children.insert(0, triton_child(ports))
    with stack:
        stack.triton = ports
        deadline = time.monotonic() + 60  # the second model may load after the first said ready
        while httpx.get(f"http://127.0.0.1:{ports['http']}/v2/models/textlen/ready", timeout=5).status_code != 200:
            assert time.monotonic() < deadline, "Triton never loaded textlen"
            time.sleep(0.2)
        yield stack


def _x() -> np.ndarray:
    return np.arange(12, dtype=np.float32).reshape(3, 4) / 3


@pytest.mark.parametrize("name", sorted(MODELS))
@pytest.mark.parametrize("binary", [True, False])
def test_tritonclient_http(triton_stack, name: str, binary: bool) -> None:
    c = triton_http.InferenceServerClient(triton_stack.url.removeprefix("http://"), network_timeout=30)
    assert c.is_model_ready(name, headers=dict(AUTH))
    meta = c.get_model_metadata(name, headers=dict(AUTH))
    assert meta["name"] == name and meta["platform"] == "python" and meta["inputs"][0]["name"] == "x"
    inp = triton_http.InferInput("x", [3, 4], "FP32")
    inp.set_data_from_numpy(_x(), binary_data=binary)
    out = triton_http.InferRequestedOutput("y", binary_data=binary)
    result = c.infer(name, [inp], outputs=[out], headers=dict(AUTH))
    np.testing.assert_allclose(result.as_numpy("y"), _x() * 2)
    doc = result.get_response()
    assert doc["model_name"] == name
    assert ("binary_data_size" in doc["outputs"][0].get("parameters", {})) == binary


@pytest.mark.parametrize("name", sorted(MODELS))
def test_tritonclient_grpc(triton_stack, name: str) -> None:
    c = triton_grpc.InferenceServerClient(triton_stack.url.removeprefix("http://"))
    assert c.is_server_ready() and c.is_model_ready(name, headers=dict(AUTH))
    assert c.get_model_metadata(name, headers=dict(AUTH)).name == name
    inp = triton_grpc.InferInput("x", [3, 4], "FP32")
    inp.set_data_from_numpy(_x())
    result = c.infer(name, [inp], headers=dict(AUTH), client_timeout=30)
    np.testing.assert_allclose(result.as_numpy("y"), _x() * 2)
    assert result.get_response().model_name == name


def _triton_requests(stack, model: str) -> int:
    """Requests Triton itself counted for `model` (its Prometheus metrics): the gateway's upstream calls."""
    text = httpx.get(f"http://127.0.0.1:{stack.triton['metrics']}/metrics", timeout=5).text
    return int(sum(float(ln.rsplit(" ", 1)[1]) for ln in text.splitlines()
                   if ln.startswith("nv_inference_request_success{") and f'model="{model}"' in ln))


def _features(texts: list[str]) -> np.ndarray:
    return np.array([(len(t.encode()), sum(t.encode())) for t in texts], np.float32)


def _text_call(stack, i: int, texts: list[str], model: str = "textlen") -> np.ndarray:
    """Caller i: REST JSON (even) or tritonclient.grpc (odd), [n, 1] BYTES texts -> its features."""
    if i % 2 == 0:
        r = httpx.post(f"{stack.url}/v2/models/{model}/infer", headers=dict(AUTH), timeout=30, json={
            "id": f"rest-{i}", "inputs": [{"name": "text", "datatype": "BYTES", "shape": [len(texts), 1],
                                           "data": texts}]})
        assert r.status_code == 200, r.text
        out = r.json()["outputs"][0]
        assert r.json()["id"] == f"rest-{i}"
        return np.array(out["data"], np.float32).reshape(out["shape"])
    inp = triton_grpc.InferInput("text", [len(texts), 1], "BYTES")
    inp.set_data_from_numpy(np.array([[t.encode()] for t in texts], dtype=np.object_))
    c = triton_grpc.InferenceServerClient(stack.url.removeprefix("http://"))
    try:
        res = c.infer(model, [inp], headers=dict(AUTH), request_id=f"grpc-{i}", client_timeout=30)
    finally:
        c.close()
    assert res.get_response().id == f"grpc-{i}"
    return res.as_numpy("features")


@pytest.mark.parametrize("model", ["textlen", "textlen-rest"], ids=["grpc-upstream", "rest-upstream"])
def test_text_tensors_of_concurrent_callers_are_batched_into_fewer_triton_calls(triton_stack, model: str) -> None:
    texts = [[f"caller {i} text"] + ([f"a second, longer text from caller {i}"] if i % 3 == 0 else [])
             for i in range(TEXT_CALLERS)]
    before = _triton_requests(triton_stack, "textlen")
    with ThreadPoolExecutor(TEXT_CALLERS) as pool:
        got = list(pool.map(lambda it: _text_call(triton_stack, *it, model=model), enumerate(texts)))
    calls = _triton_requests(triton_stack, "textlen") - before
    assert 1 <= calls < TEXT_CALLERS, f"{TEXT_CALLERS} callers made {calls} calls to Triton"
    for i, (t, rows) in enumerate(zip(texts, got, strict=True)):
        assert np.array_equal(rows, _features(t)), f"caller {i} got someone else's rows"
