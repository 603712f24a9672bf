"""drop_params: a control the chosen deployment's protocol cannot express is a 400 naming it, unless
the deployment's (or else its model's) policy drops it; driven through a Session per protocol pair."""

from __future__ import annotations

from typing import Any

import orjson
import pytest
import yaml
from prometheus_client import REGISTRY

from adapters import anthropic, bedrock, controls, gemini, openai, responses
from adapters.internal import ChatRequest, Message, TextPart
from contracts.config import parse_config
from contracts.errors import ClientError
from extproc.gateway import Gateway
from extproc.session import Session
from tests.core.session_driver import KEY, ROUTES, body_msg, headers_msg, set_headers
from tests.stack_config import ROOT, without_watermarks

U = Message("user", (TextPart("hi"),))


# -- the pure parts ------------------------------------------------------------------------------
def test_each_target_reports_what_it_cannot_express() -> None:
    req = ChatRequest("m", (U,), top_k=5, seed=7)
    assert openai.unsupported_controls(req) == ("top_k",)
    assert anthropic.unsupported_controls(req) == ("seed",)
    assert gemini.unsupported_controls(req) == ()
    assert responses.unsupported_controls(req) == ("top_k", "seed")
    assert bedrock.unsupported_controls(req) == ("seed",)
    assert openai.unsupported_controls(ChatRequest("m", (U,))) == ()


def test_decide_refuses_by_default_and_drops_what_the_policy_names() -> None:
    with pytest.raises(ClientError, match=r"generationConfig\.topK is not supported by this model's OpenAI"):
        controls.decide(("top_k",), None, target="openai", client="gemini")
    with pytest.raises(ClientError, match="top_k"):
        controls.decide(("top_k",), False, target="openai", client="openai")
    assert controls.decide(("top_k", "seed"), True, target="responses", client="openai") == ("top_k", "seed")
    assert controls.decide(("top_k",), ["top_k"], target="openai", client="openai") == ("top_k",)
    with pytest.raises(ClientError, match=r"^seed is not supported") as e:  # named: only those
        controls.decide(("top_k", "seed"), ["top_k"], target="responses", client="openai")
    assert e.value.status == 400
    stripped = controls.without(ChatRequest("m", (U,), top_k=5, seed=7), ("top_k",))
    assert (stripped.top_k, stripped.seed) == (None, 7)


def test_render_still_refuses_what_it_cannot_express() -> None:
    with pytest.raises(ClientError, match="seed"):
        anthropic.render_request(ChatRequest("m", (U,), seed=1), upstream_model="u", credential=None)
    out = orjson.loads(gemini.render_request(ChatRequest("m", (U,), seed=1, top_k=2), upstream_model="u",
                                             credential=None).body)
    assert out["generationConfig"] == {"topK": 2, "seed": 1}
    assert orjson.loads(openai.render_request(ChatRequest("m", (U,), seed=3), upstream_model="u",
                                              credential=None).body)["seed"] == 3


def test_config_validates_names_and_the_deployment_wins() -> None:
    from contracts.params import effective_drop_params
    assert effective_drop_params(["seed"], True) == ["seed"]
    assert effective_drop_params(None, True) is True
    assert effective_drop_params(False, True) is False
    data = _config({"demo-gpt": {"model": ["topk"]}})
    with pytest.raises(Exception, match="topk"):
        parse_config(data)


# -- through a Session, per protocol pair --------------------------------------------------------
def _config(policies: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The demo config with drop_params set: {model: {"model": policy, "deployments": policy}}."""
    data = without_watermarks(yaml.safe_load((ROOT / "modelyard.yaml").read_text()))
    for m in data["models"]:
        p = policies.get(m["name"])
        if p is None:
            continue
        if "model" in p:
            m["drop_params"] = p["model"]
        if "deployments" in p:
            for d in m["deployments"]:
                d["drop_params"] = p["deployments"]
    return data


def _call(client: str, model: str, param: str, value: int) -> tuple[dict[str, str], bytes]:
    """Request headers and body of a chat call in `client`'s protocol setting one control."""
    if client == "gemini":
        gc = {"topK" if param == "top_k" else "seed": value}
        body = {"contents": [{"role": "user", "parts": [{"text": "hi"}]}], "generationConfig": gc}
        return ({":method": "POST", ":path": f"/v1beta/models/{model}:generateContent",
                 "content-type": "application/json", "x-goog-api-key": KEY}, orjson.dumps(body))
    if client == "anthropic":
        return ({":method": "POST", ":path": "/v1/messages", "content-type": "application/json", "x-api-key": KEY},
                orjson.dumps({"model": model, "max_tokens": 16, "messages": [{"role": "user", "content": "hi"}],
                              param: value}))
    return ({":method": "POST", ":path": "/v1/chat/completions", "content-type": "application/json",
             "authorization": f"Bearer {KEY}"},
            orjson.dumps({"model": model, "messages": [{"role": "user", "content": "hi"}], param: value}))


async def _send(gateway: Gateway, client: str, model: str, param: str, value: int):
    headers, body = _call(client, model, param, value)
    s = Session(gateway, ROUTES)
    await s.handle(headers_msg(headers))
    r = await s.handle(body_msg(body))
    return s, r


def _dropped(model: str, cluster: str, param: str) -> float:
    v = REGISTRY.get_sample_value("modelyard_dropped_params_total",
                                  {"model": model, "deployment": cluster, "param": param})
    return v or 0.0


# (client protocol, model, its deployment's cluster, control it cannot express, the name the caller used)
PAIRS = [
    ("gemini", "demo-gpt", "demo-openai", "top_k", "generationConfig.topK"),  # Gemini's documented topK -> OpenAI
    ("anthropic", "demo-gpt", "demo-openai", "top_k", "top_k"),
    ("openai", "demo-claude", "demo-anthropic", "seed", "seed"),
    ("gemini", "demo-claude", "demo-anthropic", "seed", "generationConfig.seed"),
]


@pytest.mark.parametrize("client,model,cluster,param,spelled", PAIRS)
async def test_default_is_a_400_naming_the_control(client, model, cluster, param, spelled) -> None:
    gw = Gateway.build(parse_config(_config({})))
    s, r = await _send(gw, client, model, param, 5)
    assert r.immediate_response.status.code == 400
    assert spelled in r.immediate_response.body.decode()
    s.close()


@pytest.mark.parametrize("client,model,cluster,param,spelled", PAIRS)
@pytest.mark.parametrize("where", ["model", "deployments"])
@pytest.mark.parametrize("policy", ["all", "named"])
async def test_policy_drops_it_counts_it_and_says_so(client, model, cluster, param, spelled, where, policy) -> None:
    gw = Gateway.build(parse_config(_config({model: {where: True if policy == "all" else [param]}})))
    before = _dropped(model, cluster, param)
    s, r = await _send(gw, client, model, param, 5)
    assert r.WhichOneof("response") == "request_body", r
    out = orjson.loads(r.request_body.response.body_mutation.body)
    assert param not in out and "topK" not in str(out) and "seed" not in out.get("generationConfig", {})
    assert _dropped(model, cluster, param) == before + 1
    r = await s.handle(headers_msg({":status": "200", "content-type": "application/json"}, response=True))
    assert set_headers(r.response_headers.response.header_mutation)["x-modelyard-dropped-params"] == param
    s.close()


async def test_the_deployment_wins_over_its_model() -> None:
    # The model drops everything; its deployments name only seed: top_k is still refused.
    gw = Gateway.build(parse_config(_config({"demo-gpt": {"model": True, "deployments": ["seed"]}})))
    s, r = await _send(gw, "anthropic", "demo-gpt", "top_k", 3)
    assert r.immediate_response.status.code == 400 and b"top_k" in r.immediate_response.body
    s.close()
    # And the other way: a deployment's true overrides a model that names nothing droppable here.
    gw = Gateway.build(parse_config(_config({"demo-gpt": {"model": ["seed"], "deployments": True}})))
    s, r = await _send(gw, "anthropic", "demo-gpt", "top_k", 3)
    assert r.WhichOneof("response") == "request_body"
    s.close()


async def test_a_supported_control_is_carried_not_dropped() -> None:
    gw = Gateway.build(parse_config(_config({"demo-gemini": {"model": True}})))
    s, r = await _send(gw, "openai", "demo-gemini", "seed", 11)
    out = orjson.loads(r.request_body.response.body_mutation.body)
    assert out["generationConfig"]["seed"] == 11
    r = await s.handle(headers_msg({":status": "200", "content-type": "application/json"}, response=True))
    assert "x-modelyard-dropped-params" not in set_headers(r.response_headers.response.header_mutation)
    s.close()
