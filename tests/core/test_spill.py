"""Spill instead of refuse, driven with plain ext_proc messages: a deployment's own cluster bucket or
full queue hands the call to a peer deployment of the same model; a tenant's bucket refuses as before."""

from __future__ import annotations

import asyncio

import orjson
import yaml

from contracts.config import parse_config
from extproc.gateway import Gateway
from extproc.session import Session
from ratelimit import Limiter
from tests.core.session_driver import ROOT, ROUTES, body_msg, chat_headers, headers_msg, set_headers
from tests.stack_config import without_watermarks


def _gateway(limits: list[dict], **first: object) -> Gateway:
    data = without_watermarks(yaml.safe_load((ROOT / "modelyard.yaml").read_text()))
    pool = next(m for m in data["models"] if m["name"] == "demo-pool")
    pool["deployments"][0].update(first)
    data["ratelimit"] = {"limits": limits}
    cfg = parse_config(data)
    return Gateway.build(cfg, limiter=Limiter(cfg.ratelimit))


async def _send(gw: Gateway, text: str = "hi") -> tuple[Session, object]:
    s = Session(gw, ROUTES)
    await s.handle(headers_msg(chat_headers()))
    body = orjson.dumps({"model": "demo-pool", "messages": [{"role": "user", "content": text}]})
    return s, await s.handle(body_msg(body))


def _cluster(r) -> str:
    """The deployment Envoy is sent to (its failover aggregate, `<cluster>~failover`, when it has peers)."""
    return set_headers(r.request_body.response.header_mutation)["x-modelyard-cluster"].split("~")[0]


async def test_a_refusing_cluster_bucket_spills_to_the_peer_deployment() -> None:
    gw = _gateway([{"scope": "cluster", "match": "pool-a", "unit": "requests", "rate": 0.001, "burst": 2}])
    clusters = []
    for _ in range(5):
        s, r = await _send(gw)
        assert r.WhichOneof("response") == "request_body", r
        clusters.append(_cluster(r))
        s.close()
    assert clusters == ["pool-a", "pool-a", "pool-b", "pool-b", "pool-b"]


async def test_spill_names_the_refusing_cluster_on_the_reply() -> None:
    gw = _gateway([{"scope": "cluster", "match": "pool-a", "unit": "requests", "rate": 0.001, "burst": 1}])
    s, _ = await _send(gw)
    s.close()
    s, r = await _send(gw)
    answer = orjson.dumps({"id": "x", "object": "chat.completion", "created": 1, "model": "m", "choices": [
        {"index": 0, "message": {"role": "assistant", "content": "yo"}, "finish_reason": "stop"}]})
    reply = await s.handle(headers_msg({":status": "200", "content-type": "application/json"}, response=True))
    await s.handle(body_msg(answer, response=True))
    s.close()
    hs = set_headers(reply.response_headers.response.header_mutation)
    assert _cluster(r) == "pool-b" and hs["x-modelyard-spilled-from"] == "pool-a"


async def test_when_every_peer_refuses_the_binding_limit_is_named() -> None:
    gw = _gateway([{"scope": "cluster", "match": c, "unit": "requests", "rate": 0.001, "burst": 1}
                   for c in ("pool-a", "pool-b")])
    for _ in range(2):
        s, r = await _send(gw)
        s.close()
    s, r = await _send(gw)
    s.close()
    assert r.immediate_response.status.code == 429
    assert "cluster:pool-b" in orjson.loads(r.immediate_response.body)["error"]["message"]


async def test_a_tenant_bucket_is_not_spilled_around() -> None:
    gw = _gateway([{"scope": "tenant", "match": "demo", "unit": "requests", "rate": 0.001, "burst": 1}])
    s, _ = await _send(gw)
    s.close()
    s, r = await _send(gw)
    s.close()
    assert r.immediate_response.status.code == 429


async def test_a_full_queue_spills_to_a_peer_with_room() -> None:
    """pool-a: one slot and no queue; while it is held, the next call goes to pool-b at once."""
    gw = _gateway([], max_inflight=1, queue={"bound": 0})
    first, r1 = await _send(gw, "first")
    assert _cluster(r1) == "pool-a"
    second, r2 = await _send(gw, "second")
    assert r2.WhichOneof("response") == "request_body" and _cluster(r2) == "pool-b"
    first.close()
    second.close()
    await asyncio.sleep(0)
    third, r3 = await _send(gw, "third")  # the slot came back: pool-a again
    assert _cluster(r3) == "pool-a"
    third.close()


async def test_a_full_queue_without_a_peer_still_answers_503() -> None:
    gw = _gateway([], max_inflight=1, queue={"bound": 0})
    data = gw.config.model_dump()
    pool = next(m for m in data["models"] if m["name"] == "demo-pool")
    pool["deployments"] = pool["deployments"][:1]
    gw = Gateway.build(parse_config(data))
    first, _ = await _send(gw, "first")
    second, r = await _send(gw, "second")
    assert r.immediate_response.status.code == 503
    first.close()
    second.close()
