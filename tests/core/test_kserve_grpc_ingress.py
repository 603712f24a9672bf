"""A gRPC caller's ModelInfer through a Session, with plain ext_proc messages: errors are gRPC
statuses, the request goes upstream as a message under the upstream's model name, and the reply
comes back under the gateway's."""

from __future__ import annotations

import numpy as np
import pytest
from tritonclient.grpc import service_pb2 as pb

from adapters import kserve
from contracts.envoy_names import CLUSTER_HEADER, EXTPROC_CLUSTER
from extproc.gateway import Gateway
from extproc.service import build_routes
from extproc.session import Session
from tests.conftest import DEMO_KEY
from tests.core.session_driver import body_msg, headers_msg, set_headers

ROUTES = build_routes()
INFER = "/inference.GRPCInferenceService/ModelInfer"


def _headers(path: str = INFER, key: str | None = DEMO_KEY) -> dict[str, str]:
    h = {":method": "POST", ":path": path, "content-type": "application/grpc", "te": "trailers"}
    if key:
        h["authorization"] = f"Bearer {key}"
    return h


def _infer(model: str = "demo-colors") -> bytes:
    req = pb.ModelInferRequest(model_name=model, id="r-1")
    req.inputs.add(name="input", datatype="FP32", shape=[1, 3, 32, 32])
    req.raw_input_contents.append(np.zeros((1, 3, 32, 32), np.float32).tobytes())
    return kserve.frame(req.SerializeToString())


async def _run(gateway: Gateway, headers: dict[str, str], body: bytes | None = None):
    s = Session(gateway, ROUTES)
    r = await s.handle(headers_msg(headers))
    if body is not None and r.WhichOneof("response") == "request_headers":
        r = await s.handle(body_msg(body))
    return s, r


async def test_no_key_is_unauthenticated(gateway: Gateway) -> None:
    _, r = await _run(gateway, _headers(key=None))
    assert r.immediate_response.grpc_status.status == 16
    assert b"API key" in r.immediate_response.body  # Envoy sends it as grpc-message


async def test_unknown_model_is_not_found(gateway: Gateway) -> None:
    _, r = await _run(gateway, _headers(), _infer("nope"))
    assert r.immediate_response.grpc_status.status == 5


async def test_garbage_is_invalid_argument(gateway: Gateway) -> None:
    _, r = await _run(gateway, _headers(), b"\x00\x00\x00\x00\x03abc")
    assert r.immediate_response.grpc_status.status == 3


async def test_infer_goes_upstream_as_a_message_and_comes_back_renamed(gateway: Gateway) -> None:
    s, r = await _run(gateway, _headers(), _infer())
    assert r.WhichOneof("response") == "request_body"
    sent = set_headers(r.request_body.response.header_mutation)
    assert sent[":path"] == INFER and sent[CLUSTER_HEADER] == "demo-kserve"
    upstream = pb.ModelInferRequest.FromString(kserve.unframe(r.request_body.response.body_mutation.body))
    assert upstream.model_name == "demo-colors" and upstream.id == "r-1"  # the demo config's upstream name

    await s.handle(headers_msg({":status": "200", "content-type": "application/grpc"}, response=True))
    reply = pb.ModelInferResponse(model_name="upstream-name", id="r-1")
    reply.outputs.add(name="scores", datatype="FP32", shape=[1, 1])
    reply.raw_output_contents.append(np.ones(1, np.float32).tobytes())
    r = await s.handle(body_msg(kserve.frame(reply.SerializeToString()), response=True, eos=False))
    back = pb.ModelInferResponse.FromString(kserve.unframe(r.response_body.response.body_mutation.body))
    assert back.model_name == "demo-colors"
    s.close()


async def test_model_calls_go_to_the_extproc_itself(gateway: Gateway) -> None:
    _, r = await _run(gateway, _headers("/inference.GRPCInferenceService/ModelMetadata"))
    hr = r.request_headers.response
    assert set_headers(hr.header_mutation)[CLUSTER_HEADER] == EXTPROC_CLUSTER and hr.clear_route_cache
    _, r = await _run(gateway, _headers("/inference.GRPCInferenceService/ModelMetadata", key=None))
    assert r.immediate_response.grpc_status.status == 16  # a key is checked before it goes anywhere


async def test_rate_limited_like_rest(limited_gateway: Gateway) -> None:
    """The demo-limited tenant's bucket (burst 3): the fourth call is RESOURCE_EXHAUSTED."""
    codes = []
    for _ in range(4):
        s, r = await _run(limited_gateway, _headers(key="sk-modelyard-demo-limited"), _infer())
        codes.append(r.immediate_response.grpc_status.status if r.WhichOneof("response") == "immediate_response"
                     else 0)
        s.close()
    assert codes == [0, 0, 0, 8]


@pytest.fixture
def limited_gateway() -> Gateway:
    from pathlib import Path

    import yaml

    from contracts.config import parse_config
    from ratelimit import Limiter
    from tests.stack_config import without_watermarks

    cfg = parse_config(without_watermarks(yaml.safe_load((Path(__file__).parents[2] / "modelyard.yaml").read_text())))
    return Gateway.build(cfg, limiter=Limiter(cfg.ratelimit))
