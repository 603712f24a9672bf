"""Modelyard in front of NVIDIA Triton (nvidia-pytriton, CPU): a server that announces the binary
tensor extension, so binary REST bodies pass through as sent, and one whose replies the gateway
renames in the binary framing. tritonclient.http and tritonclient.grpc, REST and gRPC upstreams."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

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


@pytest.fixture(scope="module")
def triton_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    workdir = tmp_path_factory.mktemp("triton")
    ports = {"http": free_port(), "grpc": free_port(), "metrics": free_port()}
    models = [{"name": name, "task_types": ["infer"], "latency_ms": 20,
               "deployments": [{"cluster": f"triton-{protocol}", "protocol": protocol, "upstream_model": "double",
                                "endpoints": [f"127.0.0.1:{ports['http' if protocol == 'kserve-rest' else 'grpc']}"]}]}
              for name, protocol in MODELS.items()]
    data = {"listener": {"address": "127.0.0.1", "port": free_port()},
            "extproc": {"address": f"127.0.0.1:{free_port()}", "metrics_address": f"127.0.0.1:{free_port()}"},
            "models": models, "tenants": [_TENANT]}
    stack = start_stack(workdir, data, demos=False)
    stack.children.insert(0, triton_child(ports))
    with stack:
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
