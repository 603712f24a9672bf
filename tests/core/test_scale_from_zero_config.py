"""scale_from_zero: the config's checks and the scale request (pure parts of extproc/admission/waking.py)."""

from __future__ import annotations

import orjson
import pytest
from pydantic import ValidationError

from contracts.config import Deployment
from contracts.config.scaling import ScaleFromZero
from extproc.admission.waking import scale_call

K8S = {"kubernetes": {"namespace": "models", "deployment": "demo-mini"}}


def _dep(**over: object) -> Deployment:
    base: dict[str, object] = {"cluster": "c", "protocol": "openai", "endpoints": ["127.0.0.1:1"], "max_inflight": 2,
                               "health_check": {"http_path": "/health"}, "scale_from_zero": K8S}
    return Deployment.model_validate({**base, **over})


def test_needs_a_queue_and_a_health_check_and_one_way_to_ask() -> None:
    assert _dep().scale_from_zero is not None
    # A gRPC model server's readiness is the gRPC health protocol.
    grpc_dep = _dep(protocol="kserve-grpc", health_check={"grpc_service": ""})
    assert grpc_dep.health_check is not None and grpc_dep.health_check.grpc_service == ""
    for bad in ({"max_inflight": None}, {"health_check": None}):
        with pytest.raises(ValidationError, match="scale_from_zero needs"):
            _dep(**bad)
    with pytest.raises(ValidationError, match="exactly one"):
        ScaleFromZero.model_validate({**K8S, "webhook": "http://127.0.0.1:1/scale"})
    with pytest.raises(ValidationError, match="exactly one"):
        ScaleFromZero.model_validate({})


def test_kubernetes_asks_the_scale_subresource_with_a_merge_patch() -> None:
    call = scale_call(ScaleFromZero.model_validate(K8S), "c", "m")
    assert (call.method, call.url) == (
        "PATCH", "https://kubernetes.default.svc/apis/apps/v1/namespaces/models/deployments/demo-mini/scale")
    assert call.headers["content-type"] == "application/merge-patch+json"
    assert "authorization" not in call.headers  # the token is read fresh at send time
    assert orjson.loads(call.body) == {"spec": {"replicas": 1}}
    sfz = ScaleFromZero.model_validate(K8S)
    assert sfz.kubernetes is not None and sfz.kubernetes.token_file == "/var/run/secrets/kubernetes.io/serviceaccount/token"


def test_webhook_posts_the_deployment_and_model() -> None:
    call = scale_call(ScaleFromZero.model_validate({"webhook": "http://127.0.0.1:9/scale"}), "c", "m")
    assert (call.method, call.url) == ("POST", "http://127.0.0.1:9/scale")
    assert orjson.loads(call.body) == {"cluster": "c", "model": "m", "replicas": 1}
