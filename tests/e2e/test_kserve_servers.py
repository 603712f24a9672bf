"""Modelyard in front of a real KServe v2 server: MLServer serving a scikit-learn model trained in
the test, reached over REST and over gRPC, called with tritonclient (JSON and binary tensors)
through a real Envoy. Predictions are checked against scikit-learn's own."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import httpx
import numpy as np
import pytest
import tritonclient.grpc as triton_grpc
import tritonclient.http as triton_http
from tritonclient.utils import InferenceServerException

from tests.conftest import DEMO_KEY
from tests.kserve_servers import FEATURES, MODEL, mlserver_child, mlserver_missing, prepare_mlserver
from tests.stack_config import free_port, start_stack

pytestmark = [pytest.mark.e2e, pytest.mark.skipif(mlserver_missing() is not None, reason=str(mlserver_missing()))]

# A fresh dict per call: tritonclient writes its Inference-Header-Content-Length into the one it gets.
AUTH = {"authorization": f"Bearer {DEMO_KEY}"}
_TENANT = {"name": "demo", "tier": "L1", "allowed_models": ["*"],
           "api_keys": ["sha256:c898d9f492d2577070136e9b8f2852e4f208ee9f1f4a5dff1385dcea7966f81e"]}
# Gateway name -> protocol of its one deployment on MLServer (tabular: no vision capability).
MODELS = {"tabular": "kserve-rest", "tabular-grpc": "kserve-grpc"}


def _config(ports: dict[str, int]) -> dict[str, Any]:
    models = [{"name": name, "task_types": ["infer"], "latency_ms": 20,
               "deployments": [{"cluster": f"mlserver-{protocol}", "protocol": protocol, "upstream_model": MODEL,
                                "endpoints": [f"127.0.0.1:{ports['http' if protocol == 'kserve-rest' else 'grpc']}"]}]}
              for name, protocol in MODELS.items()]
    return {"listener": {"address": "127.0.0.1", "port": free_port()},
            "extproc": {"address": f"127.0.0.1:{free_port()}", "metrics_address": f"127.0.0.1:{free_port()}"},
            "models": models, "tenants": [_TENANT]}


@pytest.fixture(scope="module")
def mlserver_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    workdir = tmp_path_factory.mktemp("mlserver")
    ml = prepare_mlserver(workdir)
    stack = start_stack(workdir, _config(ml["ports"]), demos=False)
    stack.children.insert(0, mlserver_child(ml["repo"], ml["ports"]["http"]))
    stack.expected = ml["expected"]
    with stack:
        yield stack


def _client(stack: Any) -> triton_http.InferenceServerClient:
    return triton_http.InferenceServerClient(stack.url.removeprefix("http://"), network_timeout=20)


def _x(stack: Any) -> np.ndarray:
    return np.array(stack.expected["x"], dtype=np.float64)


def test_readiness_and_liveness_come_from_the_upstream(mlserver_stack) -> None:
    c = _client(mlserver_stack)
    assert c.is_server_live() and c.is_server_ready()
    for name in MODELS:
        assert c.is_model_ready(name, headers=dict(AUTH))
        assert c.is_model_ready(name, "v1", headers=dict(AUTH))
        assert not c.is_model_ready(name, "v9", headers=dict(AUTH))  # MLServer has no such version
    assert not c.is_model_ready("nope", headers=dict(AUTH))
    assert not c.is_model_ready("tabular")  # no key: refused, so not ready


@pytest.mark.parametrize("name", sorted(MODELS))
def test_model_metadata_is_the_upstreams_under_the_gateway_name(mlserver_stack, name: str) -> None:
    meta = _client(mlserver_stack).get_model_metadata(name, headers=dict(AUTH))
    assert meta["name"] == name
    assert meta["inputs"] == [{"name": "features", "datatype": "FP64", "shape": [-1, FEATURES]}]
    assert meta["outputs"] == [{"name": "predict", "datatype": "INT64", "shape": [-1, 1]}]
    r = httpx.get(f"{mlserver_stack.url}/v2/models/{name}/versions/v1", headers=AUTH, timeout=10)
    assert r.status_code == 200 and r.json()["name"] == name
    r = httpx.get(f"{mlserver_stack.url}/v2/models/{name}/versions/v9", headers=AUTH, timeout=10)
    assert r.status_code == 404 and MODEL not in r.text  # the upstream's name stays inside


def test_server_metadata_is_spec_shaped(mlserver_stack) -> None:
    meta = _client(mlserver_stack).get_server_metadata()
    assert meta["name"] == "modelyard" and isinstance(meta["version"], str)
    assert "binary_tensor_data" in meta["extensions"]


@pytest.mark.parametrize("name", sorted(MODELS))
@pytest.mark.parametrize("binary_in,binary_out", [(False, False), (True, True), (False, True), (True, False)])
def test_tritonclient_http_infer_json_and_binary(mlserver_stack, name: str, binary_in: bool,
                                                 binary_out: bool) -> None:
    x = _x(mlserver_stack)
    inp = triton_http.InferInput("features", list(x.shape), "FP64")
    inp.set_data_from_numpy(x, binary_data=binary_in)
    out = triton_http.InferRequestedOutput("predict", binary_data=binary_out)
    result = _client(mlserver_stack).infer(name, [inp], outputs=[out], headers=dict(AUTH))
    assert result.as_numpy("predict").ravel().tolist() == mlserver_stack.expected["predict"]
    doc = result.get_response()
    assert doc["model_name"] == name
    predict = doc["outputs"][0]
    assert ("binary_data_size" in predict.get("parameters", {})) == binary_out
    assert ("data" in predict) == (not binary_out)


@pytest.mark.parametrize("name", sorted(MODELS))
def test_tritonclient_defaults_binary_everything(mlserver_stack, name: str) -> None:
    """No outputs named and binary inputs: tritonclient's defaults, MLServer 1.7 takes neither."""
    x = _x(mlserver_stack)
    inp = triton_http.InferInput("features", list(x.shape), "FP64")
    inp.set_data_from_numpy(x)
    result = _client(mlserver_stack).infer(name, [inp], headers=dict(AUTH))
    assert result.as_numpy("predict").ravel().tolist() == mlserver_stack.expected["predict"]


@pytest.mark.parametrize("name", sorted(MODELS))
def test_v2_replies_carry_only_public_headers(mlserver_stack, name: str) -> None:
    x = _x(mlserver_stack)
    body = {"inputs": [{"name": "features", "datatype": "FP64", "shape": list(x.shape), "data": x.ravel().tolist()}]}
    r = httpx.post(f"{mlserver_stack.url}/v2/models/{name}/infer", json=body, headers=AUTH, timeout=20)
    assert r.status_code == 200, r.text
    assert r.json()["model_name"] == name
    assert not [h for h in r.headers if h.startswith("x-modelyard-upstream")]
    assert r.headers["x-modelyard-cluster"].startswith("mlserver-")


# ---------------------------------------------------------------- gRPC callers (tritonclient.grpc)


def _grpc(stack: Any) -> triton_grpc.InferenceServerClient:
    return triton_grpc.InferenceServerClient(stack.url.removeprefix("http://"))


@pytest.mark.parametrize("name", sorted(MODELS))
def test_tritonclient_grpc_infer_reaches_rest_and_grpc_upstreams(mlserver_stack, name: str) -> None:
    """gRPC to the gRPC upstream directly; to the REST one through its bridge listener."""
    x = _x(mlserver_stack)
    inp = triton_grpc.InferInput("features", list(x.shape), "FP64")
    inp.set_data_from_numpy(x)
    result = _grpc(mlserver_stack).infer(name, [inp], outputs=[triton_grpc.InferRequestedOutput("predict")],
                                         request_id="g-1", headers=dict(AUTH), client_timeout=20)
    assert result.as_numpy("predict").ravel().tolist() == mlserver_stack.expected["predict"]
    resp = result.get_response()
    assert resp.model_name == name and resp.id == "g-1"


def test_tritonclient_grpc_health_and_metadata(mlserver_stack) -> None:
    c = _grpc(mlserver_stack)
    assert c.is_server_live() and c.is_server_ready()
    meta = c.get_server_metadata()
    assert meta.name == "modelyard" and "binary_tensor_data" in meta.extensions
    for name in MODELS:
        assert c.is_model_ready(name, headers=dict(AUTH))
        assert not c.is_model_ready(name, "v9", headers=dict(AUTH))
        m = c.get_model_metadata(name, headers=dict(AUTH))
        assert m.name == name and [(t.name, t.datatype, list(t.shape)) for t in m.inputs] == \
            [("features", "FP64", [-1, FEATURES])]


@pytest.mark.parametrize("call,status", [
    (lambda c: c.get_model_metadata("nope", headers=dict(AUTH)), "StatusCode.NOT_FOUND"),
    (lambda c: c.get_model_metadata("tabular"), "StatusCode.UNAUTHENTICATED"),
    (lambda c: c.infer("nope", [_grpc_input()], headers=dict(AUTH)), "StatusCode.NOT_FOUND"),
    (lambda c: c.infer("tabular", [_grpc_input()]), "StatusCode.UNAUTHENTICATED"),
])
def test_tritonclient_grpc_errors_are_grpc_statuses(mlserver_stack, call, status: str) -> None:
    with pytest.raises(InferenceServerException) as e:
        call(_grpc(mlserver_stack))
    assert e.value.status() == status, e.value.message()


def _grpc_input() -> Any:
    inp = triton_grpc.InferInput("features", [1, FEATURES], "FP64")
    inp.set_data_from_numpy(np.zeros((1, FEATURES)))
    return inp


@pytest.mark.parametrize("name", sorted(MODELS))
def test_upstream_refusal_reaches_a_grpc_caller_as_a_status(mlserver_stack, name: str) -> None:
    inp = triton_grpc.InferInput("features", [2], "FP64")  # a 1-D input: scikit-learn refuses it
    inp.set_data_from_numpy(np.zeros(2))
    with pytest.raises(InferenceServerException) as e:
        _grpc(mlserver_stack).infer(name, [inp], headers=dict(AUTH), client_timeout=10)
    assert e.value.status() != "StatusCode.OK" and e.value.message()


@pytest.mark.parametrize("name", sorted(MODELS))
def test_grpc_replies_carry_only_public_metadata(mlserver_stack, name: str) -> None:
    import grpc
    from tritonclient.grpc import service_pb2 as pb
    from tritonclient.grpc import service_pb2_grpc as pb_grpc

    x = _x(mlserver_stack)
    req = pb.ModelInferRequest(model_name=name)
    req.inputs.add(name="features", datatype="FP64", shape=list(x.shape))
    req.raw_input_contents.append(x.astype("<f8").tobytes())
    with grpc.insecure_channel(mlserver_stack.url.removeprefix("http://")) as ch:
        resp, call = pb_grpc.GRPCInferenceServiceStub(ch).ModelInfer.with_call(
            req, metadata=[("authorization", AUTH["authorization"])], timeout=20)
        seen = [k for k, _ in (*call.initial_metadata(), *call.trailing_metadata())]
    assert resp.model_name == name
    assert "x-modelyard-task-id" in seen and not [k for k in seen if k.startswith("x-modelyard-upstream")]


def test_readiness_follows_the_upstream_down(mlserver_stack) -> None:
    """Last in this module: stops MLServer, then nothing may claim to be ready."""
    c = _client(mlserver_stack)
    ml = mlserver_stack.child("mlserver")
    ml.proc.terminate()
    ml.proc.wait(timeout=30)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and c.is_server_ready():
        time.sleep(0.5)  # the probe's answers are cached for two seconds
    assert not c.is_server_ready()
    assert c.is_server_live()  # the gateway itself lives on
    for name in MODELS:
        assert not c.is_model_ready(name, headers=dict(AUTH))
        assert not _grpc(mlserver_stack).is_model_ready(name, headers=dict(AUTH))
    assert not _grpc(mlserver_stack).is_server_ready()
    r = httpx.get(f"{mlserver_stack.url}/v2/models/tabular", headers=AUTH, timeout=10)
    assert r.status_code == 503 and "error" in r.json()
