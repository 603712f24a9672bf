"""Sessions queueing for a deployment's slot, driven with plain ext_proc messages: the slot comes
back on every ending (answer, upstream error, stream end, client reset) and the next session goes."""

from __future__ import annotations

import asyncio

import orjson
import pytest
import yaml

from contracts.config import parse_config
from extproc.gateway import Gateway
from extproc.session import Session
from tests.core.session_driver import ROOT, ROUTES, body_msg, chat_headers, headers_msg, set_headers
from tests.stack_config import without_watermarks

CLUSTER = "demo-openai"
ANSWER = orjson.dumps({"id": "x", "object": "chat.completion", "created": 1, "model": "demo-gpt",
                       "choices": [{"index": 0, "message": {"role": "assistant", "content": "yo"},
                                    "finish_reason": "stop"}],
                       "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}})


@pytest.fixture
def gateway() -> Gateway:
    data = without_watermarks(yaml.safe_load((ROOT / "modelyard.yaml").read_text()))
    gpt = next(m for m in data["models"] if m["name"] == "demo-gpt")
    gpt["deployments"][0].update(max_inflight=1, queue={"max_wait_s": 5})
    return Gateway.build(parse_config(data))


async def _open(gw: Gateway, text: str) -> tuple[Session, asyncio.Task]:
    """A session past its headers, its body step running (it returns once it has a slot)."""
    s = Session(gw, ROUTES)
    await s.handle(headers_msg(chat_headers()))
    body = orjson.dumps({"model": "demo-gpt", "messages": [{"role": "user", "content": text}]})
    task = asyncio.ensure_future(s.handle(body_msg(body)))
    await asyncio.sleep(0.01)
    return s, task


def _queue(gw: Gateway):
    return gw.dispatcher.limits.queues[CLUSTER]


async def _answer(s: Session, status: int = 200, body: bytes = ANSWER) -> dict[str, str]:
    r = await s.handle(headers_msg({":status": str(status), "content-type": "application/json"}, response=True))
    hs = set_headers(r.response_headers.response.header_mutation)
    await s.handle(body_msg(body, response=True))
    s.close()
    return hs


@pytest.mark.parametrize("ending", ["answer", "upstream_error", "client_reset"])
async def test_next_session_goes_when_the_slot_comes_back(gateway: Gateway, ending: str) -> None:
    first, sent = await _open(gateway, "first")
    assert sent.done() and sent.result().WhichOneof("response") == "request_body"
    second, waiting = await _open(gateway, "second")
    assert not waiting.done() and _queue(gateway).waiting() == 1
    # The slot held 10 ms from here, with the second already queued: its wait is at least that (the
    # 10 ms in `_open` also pay for its parse and routing, which a loaded box stretched to 5 ms).
    await asyncio.sleep(0.01)
    if ending == "answer":
        hs = await _answer(first)
        assert hs["x-modelyard-queue-wait-ms"] == "0.0"
    elif ending == "upstream_error":
        await _answer(first, 500, b'{"error": {"message": "boom"}}')
    else:
        first.close()  # Envoy closed the stream: the client went away
    r = await asyncio.wait_for(waiting, 1)
    assert set_headers(r.request_body.response.header_mutation)["x-modelyard-cluster"] == CLUSTER
    hs = await _answer(second)
    assert float(hs["x-modelyard-queue-wait-ms"]) >= 10.0
    assert _queue(gateway).inflight == 0 and _queue(gateway).waiting() == 0


async def test_session_cancelled_while_waiting_leaves_no_trace(gateway: Gateway) -> None:
    first, _ = await _open(gateway, "first")
    leaving, left = await _open(gateway, "leaves")
    third, waiting = await _open(gateway, "third")
    left.cancel()  # grpc.aio cancels the stream's task when the client resets
    with pytest.raises(asyncio.CancelledError):
        await left
    leaving.close()
    assert _queue(gateway).waiting() == 1
    await _answer(first)
    await asyncio.wait_for(waiting, 1)
    await _answer(third)
    assert _queue(gateway).inflight == 0


async def test_refused_request_gets_its_rate_limit_tokens_back(gateway: Gateway) -> None:
    """Past the queue's bound: a 503 in the caller's shape, and the token estimate charged on arrival is returned."""
    from ratelimit import Limiter

    data = gateway.config.model_dump()
    data["ratelimit"] = {"limits": [{"scope": "tenant", "match": "demo", "unit": "tokens", "rate": 0.001,
                                     "burst": 100_000}]}
    gpt = next(m for m in data["models"] if m["name"] == "demo-gpt")
    gpt["deployments"][0]["queue"] = {"bound": 0}
    gpt["capabilities"]["max_output_tokens"] = 20_000  # the large estimate below is one it may give
    cfg = parse_config(data)
    gw = Gateway.build(cfg, limiter=Limiter(cfg.ratelimit))
    first, _ = await _open(gw, "first")
    s = Session(gw, ROUTES)
    await s.handle(headers_msg(chat_headers()))
    body = orjson.dumps({"model": "demo-gpt", "max_tokens": 20_000, "messages": [{"role": "user", "content": "x"}]})
    r = await s.handle(body_msg(body))
    s.close()
    assert r.immediate_response.status.code == 503
    assert orjson.loads(r.immediate_response.body)["error"]["type"] == "server_error"  # OpenAI's name for a 503
    assert int(set_headers(r.immediate_response.headers)["retry-after"]) >= 1
    await _answer(first)
    nxt, _ = await _open(gw, "next")
    remaining = int((await _answer(nxt))["x-ratelimit-remaining-tokens"])
    # Without the refund the refused request's 20,000 would still be missing from the bucket.
    assert remaining > 100_000 - 20_000, remaining


async def test_vision_request_that_goes_alone_queues_too() -> None:
    data = without_watermarks(yaml.safe_load((ROOT / "modelyard.yaml").read_text()))
    colors = next(m for m in data["models"] if m["name"] == "demo-colors")
    colors["deployments"][0]["max_inflight"] = 1
    gw = Gateway.build(parse_config(data))  # no batcher: every request goes alone
    infer = {":method": "POST", ":path": "/v2/models/demo-colors/infer", "authorization": "Bearer sk-modelyard-demo",
             "content-type": "application/json"}
    body = orjson.dumps({"inputs": [{"name": "input", "datatype": "FP32", "shape": [1, 3, 32, 32],
                                     "data": [0.0] * 3072}]})

    async def start() -> tuple[Session, asyncio.Task]:
        s = Session(gw, ROUTES)
        await s.handle(headers_msg(infer))
        task = asyncio.ensure_future(s.handle(body_msg(body)))
        await asyncio.sleep(0.01)
        return s, task

    first, sent = await start()
    # Bounded waits, not a fixed sleep: under a loaded machine the body step may take longer than 10 ms.
    assert (await asyncio.wait_for(asyncio.shield(sent), 5)).WhichOneof("response") == "request_body"
    second, waiting = await start()
    queue = gw.dispatcher.limits.queues["demo-kserve"]
    for _ in range(500):
        if queue.waiting():
            break
        await asyncio.sleep(0.01)
    assert queue.waiting() == 1 and not waiting.done()
    first.close()  # the client went away: its slot comes back
    r = await asyncio.wait_for(waiting, 1)
    assert r.WhichOneof("response") == "request_body"
    second.close()
    assert gw.dispatcher.limits.queues["demo-kserve"].inflight == 0
