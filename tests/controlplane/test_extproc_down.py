"""No extproc answering, against a real Envoy alone: every request gets Envoy's own 503 with
`retry-after`, in the caller's protocol's JSON error shape (controlplane.local_replies); never an
empty 500, never a reset. gRPC callers get UNAVAILABLE."""

from __future__ import annotations

from collections.abc import Iterator

import grpc
import httpx
import pytest

from controlplane.environments import EnvironmentConfig
from controlplane.local_replies import MESSAGE, RETRY_AFTER_S
from tests.controlplane.bare_envoy import BareEnvoy


@pytest.fixture(scope="module")
def envoy(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BareEnvoy]:
    env = EnvironmentConfig(name="down", admin={"address": "127.0.0.1", "port": 0}, concurrency=1)
    with BareEnvoy(tmp_path_factory.mktemp("down"), env) as e:
        yield e


def _message(protocol: str, body: dict) -> str:
    if protocol == "anthropic":
        assert body["type"] == "error"
        return body["error"]["message"]
    if protocol == "gemini":
        assert body["error"]["status"] == "UNAVAILABLE" and body["error"]["code"] == 503
        return body["error"]["message"]
    if protocol == "kserve":
        return body["error"]
    assert body["error"]["type"]
    return body["error"]["message"]


@pytest.mark.parametrize("method,path,protocol", [
    ("POST", "/v1/chat/completions", "openai"),
    ("POST", "/v1/responses", "openai"),
    ("GET", "/v1/models", "openai"),
    ("POST", "/v1/messages", "anthropic"),
    ("POST", "/v1beta/models/demo:generateContent?alt=sse", "gemini"),
    ("POST", "/v1/models/demo:streamGenerateContent", "gemini"),
    ("POST", "/v2/models/resnet/infer", "kserve"),
    ("GET", "/v2/health/ready", "kserve"),
    ("POST", "/v1/images/classify", "kserve"),
])
def test_every_protocol_gets_a_json_503_with_retry_after(envoy: BareEnvoy, method: str, path: str,
                                                         protocol: str) -> None:
    r = httpx.request(method, f"http://127.0.0.1:{envoy.port}{path}", json={"model": "demo"}, timeout=10)
    assert r.status_code == 503, r.text
    assert r.headers["retry-after"] == str(RETRY_AFTER_S)
    assert r.headers["content-type"] == "application/json"
    assert _message(protocol, r.json()) == MESSAGE


def test_a_kept_alive_client_gets_503s_without_a_reset(envoy: BareEnvoy) -> None:
    with httpx.Client(base_url=f"http://127.0.0.1:{envoy.port}", timeout=10) as c:
        statuses = [c.post("/v1/chat/completions", json={"model": "demo", "messages": []}).status_code
                    for _ in range(20)]
    assert statuses == [503] * 20


def test_a_grpc_caller_gets_unavailable(envoy: BareEnvoy) -> None:
    with grpc.insecure_channel(f"127.0.0.1:{envoy.port}") as channel:
        call = channel.unary_unary("/inference.GRPCInferenceService/ModelInfer")
        with pytest.raises(grpc.RpcError) as e:
            call(b"", timeout=10)
    assert e.value.code() == grpc.StatusCode.UNAVAILABLE
