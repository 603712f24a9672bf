"""`UpstreamCall`: the headers every flow's upstream request carries, and its outcome metered once."""

from __future__ import annotations

import pytest
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb

from adapters.cloud_targets import AzureTarget
from adapters.internal import Usage
from extproc.admission.auth import Identity
from extproc.context import RequestContext
from extproc.flows.upstream import STRIP_UPSTREAM, Deadline, UpstreamCall, upstream_error_status
from extproc.flows.xlate import XlateFlow
from extproc.gateway import Gateway
from extproc.routing import RouteRequest

KEY = "sk-modelyard-demo"  # the demo config's tenant `demo`


def set_headers(mutation: pb.HeaderMutation) -> dict[str, str]:
    return {h.header.key: h.header.raw_value.decode() for h in mutation.set_headers}


def _call(gateway: Gateway, model: str, *, task: str = "chat", metered: bool = True) -> UpstreamCall:
    ctx = RequestContext(task_id="t" * 32, method="POST", path="/x", query={}, headers={})
    found = gateway.keyring.identify(KEY)
    assert isinstance(found, Identity)
    ctx.tenant = found.tenant
    call = UpstreamCall(gateway, ctx, metered=metered)
    call.choice = gateway.dispatcher.choose(RouteRequest(model=model, tenant=ctx.tenant, task_type=task,
                                                         task_id=ctx.task_id))
    return call


def _sent(r: pb.ProcessingResponse) -> tuple[dict[str, str], list[str], pb.CommonResponse]:
    common = r.request_body.response
    return set_headers(common.header_mutation), list(common.header_mutation.remove_headers), common


def test_router_deadline_cluster_task_and_credentials(gateway: Gateway) -> None:
    call = _call(gateway, "demo-gpt")
    dep = call.choice.deployment if call.choice else None
    assert dep is not None
    r = call.request("/v1/chat/completions", b"{}", {"authorization": "Bearer upstream-key"})
    hs, removed, common = _sent(r)
    assert hs[":path"] == "/v1/chat/completions" and hs["content-length"] == "2"
    assert hs["x-modelyard-cluster"] == gateway.catalog.envoy_cluster(dep.cluster)
    assert hs["x-envoy-upstream-rq-timeout-ms"] == str(dep.timeout_ms)
    assert hs["x-modelyard-task-id"] == "t" * 32 and hs["x-modelyard-tenant"] == "demo"
    # The deployment's credential replaces the client's; every other client credential is removed.
    assert hs["authorization"] == "Bearer upstream-key" and "authorization" not in removed
    assert set(removed) == set(STRIP_UPSTREAM) - {"authorization"}
    assert {"x-api-key", "x-goog-api-key", "accept-encoding"} <= set(removed)
    assert common.body_mutation.body == b"{}" and common.clear_route_cache


@pytest.mark.parametrize("deadline,expected", [
    pytest.param("grpc", {"te": "trailers", "grpc-timeout": "{ms}m"}, id="grpc-timeout"),
    pytest.param(None, {}, id="none"),
])
def test_other_deadlines(gateway: Gateway, deadline: Deadline | None, expected: dict[str, str]) -> None:
    call = _call(gateway, "demo-colors", task="image-classification")
    assert call.choice is not None
    ms = call.choice.deployment.timeout_ms
    r = call.request("/p", b"x", {"content-type": "application/grpc"}, deadline=deadline,
                     cluster="own-cluster", extra=[("x-extra", "1")], strip=["x-binary"], replace_body=False)
    hs, removed, common = _sent(r)
    assert {k: v for k, v in hs.items() if k in ("te", "grpc-timeout")} == \
        {k: v.format(ms=ms) for k, v in expected.items()}
    assert "x-envoy-upstream-rq-timeout-ms" not in hs
    assert hs["x-modelyard-cluster"] == "own-cluster" and hs["x-extra"] == "1" and "x-binary" in removed
    assert not common.HasField("body_mutation")  # the client's bytes go as they came


def test_finish_meters_once_and_release_ends_the_call(gateway: Gateway) -> None:
    call = _call(gateway, "demo-gpt")
    assert call.pending
    call.finish(200, upstream_ok=True, usage=Usage(3, 4))
    call.finish(502, upstream_ok=False)  # a later end (close after the body) changes nothing
    outcome = call.ctx.outcome
    assert outcome is not None and (outcome.status, outcome.input_tokens, outcome.output_tokens) == (200, 3, 4)
    assert not call.pending

    deferred = _call(gateway, "demo-gpt")
    deferred.release()
    deferred.finish(200, upstream_ok=True)
    assert not deferred.pending and deferred.ctx.outcome is None  # the replay is metered, not the acceptance


def test_a_translation_hop_is_not_metered(gateway: Gateway) -> None:
    call = _call(gateway, "demo-gpt", metered=False)
    call.finish(200, upstream_ok=True, usage=Usage(1, 1))
    assert call.finished and call.ctx.outcome is None


@pytest.mark.parametrize("upstream,client", [(400, 400), (404, 404), (413, 413), (422, 400), (429, 429),
                                             (401, 502), (403, 502), (500, 502), (503, 502), (504, 504)])
def test_upstream_error_status(upstream: int, client: int) -> None:
    assert upstream_error_status(upstream) == client


async def test_authorize_gives_the_deployment_credential_and_cloud_target(gateway: Gateway,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DEMO_AZURE_KEY", "azure-key-1")
    call = _call(gateway, "demo-azure")
    auth = await call.authorize()
    assert call.auth is auth and auth.credential == "azure-key-1"
    assert isinstance(auth.cloud, AzureTarget)


async def test_translation_hop_sends_its_target_deployment_credential(gateway: Gateway,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    # The hop is not routed (the outer request was): it still needs the target's own key.
    monkeypatch.setenv("DEMO_ANTHROPIC_KEY", "anthropic-key-1")
    ctx = RequestContext(task_id="t" * 32, method="POST", path="/v1/chat/completions", query={}, headers={})
    flow = XlateFlow(gateway, ctx, "demo-anthropic")
    body = b'{"model": "demo-claude", "messages": [{"role": "user", "content": "hi"}]}'
    hs, removed, _ = _sent(await flow.request_body(body))
    assert hs["x-api-key"] == "anthropic-key-1" and "x-api-key" not in removed
    assert hs[":path"] == "/v1/messages"
