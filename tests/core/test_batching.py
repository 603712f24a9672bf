"""The batcher's logic without Envoy: flush rules, leader/member outcomes, fallback, leaving members."""

from __future__ import annotations

import asyncio
import time

import numpy as np
import pytest
from tritonclient.grpc import service_pb2 as pb

from contracts.config import BatchingConfig, BatchPadConfig, TensorInput
from extproc.flows.vision import Job, merge_batch
from extproc.vision.batching import HARD_CAP, Batcher, BatchKey, BatchPolicy
from kernels import PreprocessSpec, preprocess

KEY = BatchKey("m", "c", (3, 4, 4), "FP32")
SLOW = BatchPolicy(max_delay_s=10.0, min_size=4, max_size=8)  # only size flushes within a test


def _batcher(**kw) -> tuple[Batcher, list, list]:
    flushed: list = []
    fallbacks: list = []
    b = Batcher(on_flush=flushed.append, on_fallback=lambda batch, n: fallbacks.append(n), **kw)
    return b, flushed, fallbacks


async def test_flush_at_min_size_when_idle() -> None:
    b, flushed, _ = _batcher()
    ms = [b.join(KEY, SLOW, i, 1) for i in range(4)]
    await asyncio.sleep(0)
    assert len(flushed) == 1 and flushed[0].rows == 4
    first = ms[0].future.result()
    assert first.role == "leader" and first.batch is flushed[0]
    assert not any(m.future.done() for m in ms[1:])


async def test_flush_after_max_delay() -> None:
    b, flushed, _ = _batcher()
    pol = BatchPolicy(max_delay_s=0.02, min_size=4, max_size=8)
    m1, m2 = b.join(KEY, pol, "a", 1), b.join(KEY, pol, "b", 2)
    assert not flushed
    out = await b.wait(m1, 1.0)
    assert out.role == "leader" and out.batch.rows == 3 and [m.start for m in out.batch.members] == [0, 1]
    assert not m2.future.done()


async def test_complete_gives_every_member_its_offset() -> None:
    b, flushed, _ = _batcher()
    pol = BatchPolicy(max_delay_s=10.0, min_size=5, max_size=8)
    ms = [b.join(KEY, pol, i, n) for i, n in enumerate([1, 2, 1, 1])]
    batch = flushed[0]
    assert batch.rows == 5
    b.complete(batch, "reply")
    outs = [m.future.result() for m in ms[1:]]
    assert [(o.role, o.response, o.start) for o in outs] == [("result", "reply", 1), ("result", "reply", 3),
                                                               ("result", "reply", 4)]
    assert b.inflight(KEY) == 0


async def test_leader_failure_sends_members_to_fallback() -> None:
    b, flushed, fallbacks = _batcher()
    ms = [b.join(KEY, SLOW, i, 1) for i in range(4)]
    b.fail(flushed[0], "upstream said no")
    outs = [m.future.result() for m in ms[1:]]
    assert all(o.role == "fallback" and o.reason == "upstream said no" for o in outs)
    assert fallbacks == [3]
    b.complete(flushed[0], "late reply")  # a finished batch ignores later reports
    assert all(m.future.result().role == "fallback" for m in ms[1:])


async def test_member_leaving_an_open_batch_is_dropped() -> None:
    b, flushed, _ = _batcher()
    pol = BatchPolicy(max_delay_s=0.02, min_size=8, max_size=8)
    ms = [b.join(KEY, pol, i, 1) for i in range(3)]
    b.leave(ms[0])
    assert ms[0].future.cancelled()
    out = await b.wait(ms[1], 1.0)
    assert out.role == "leader"
    assert [m.payload for m in out.batch.members] == [1, 2] and [m.start for m in out.batch.members] == [0, 1]
    assert out.batch.rows == 2


async def test_member_leaving_after_dispatch_does_not_disturb_the_rest() -> None:
    b, flushed, _ = _batcher()
    ms = [b.join(KEY, SLOW, i, 1) for i in range(4)]
    b.leave(ms[2])
    b.complete(flushed[0], "reply")
    assert ms[2].future.cancelled()
    assert [ms[i].future.result().start for i in (1, 3)] == [1, 3]


async def test_leader_leaving_after_dispatch_fails_the_batch() -> None:
    b, flushed, fallbacks = _batcher()
    ms = [b.join(KEY, SLOW, i, 1) for i in range(4)]
    b.leave(ms[0])
    assert all(m.future.result().role == "fallback" for m in ms[1:]) and fallbacks == [3]


async def test_cancelled_waiter_leaves() -> None:
    b, flushed, _ = _batcher()
    pol = BatchPolicy(max_delay_s=0.05, min_size=8, max_size=8)
    m1, m2 = b.join(KEY, pol, 1, 1), b.join(KEY, pol, 2, 1)
    task = asyncio.create_task(b.wait(m1, 5))
    await asyncio.sleep(0)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    out = await b.wait(m2, 1.0)
    assert out.role == "leader" and [m.payload for m in out.batch.members] == [2]


async def test_wait_timeout_falls_back() -> None:
    b, flushed, _ = _batcher()
    ms = [b.join(KEY, SLOW, i, 1) for i in range(4)]
    out = await b.wait(ms[1], 0.01)
    assert out.role == "fallback" and ms[1].gone
    b.complete(flushed[0], "reply")
    assert ms[2].future.result().role == "result"


async def test_too_big_requests_go_alone_and_full_batches_go_at_once() -> None:
    b, flushed, _ = _batcher()
    assert b.join(KEY, SLOW, "huge", 9) is None
    assert b.join(KEY, BatchPolicy(max_size=1), "x", 1) is None
    pol = BatchPolicy(max_delay_s=10, min_size=8, max_size=8)
    b.join(KEY, pol, "a", 5)
    b.join(KEY, pol, "b", 5)  # would overflow: the open batch leaves, b opens the next one
    assert len(flushed) == 1 and flushed[0].rows == 5
    assert b.queue_rows(KEY) == 10


async def test_busy_key_holds_the_next_batch_until_a_reply() -> None:
    b, flushed, _ = _batcher()
    pol = BatchPolicy(max_delay_s=0.01, min_size=2, max_size=16, max_inflight=1)
    first = [b.join(KEY, pol, i, 1) for i in range(2)]
    assert len(flushed) == 1
    # Rows in flight raise the target (queue depth): 2 more do not flush at min_size any more.
    second = [b.join(KEY, pol, i, 1) for i in range(2, 5)]
    await asyncio.sleep(0.05)  # past max_delay, but the key is busy: held
    assert len(flushed) == 1 and not second[0].future.done()
    b.complete(flushed[0], "r1")
    assert len(flushed) == 2 and flushed[1].rows == 3
    assert second[0].future.result().role == "leader" and first[1].future.result().start == 1


async def test_hold_cap_bounds_the_wait_behind_a_stuck_batch() -> None:
    b, flushed, _ = _batcher(hold_cap_s=0.03)
    pol = BatchPolicy(max_delay_s=0.01, min_size=1, max_size=16)
    b.join(KEY, pol, "stuck", 1)
    m = b.join(KEY, pol, "next", 4)
    out = await b.wait(m, 1.0)
    assert out.role == "leader" and len(flushed) == 2


async def test_keys_do_not_mix() -> None:
    b, flushed, _ = _batcher()
    other = BatchKey("m", "c", (3, 8, 8), "FP32")
    for i in range(3):
        b.join(KEY, SLOW, i, 1)
        b.join(other, SLOW, i, 1)
    assert not flushed
    b.join(other, SLOW, 9, 1)
    assert len(flushed) == 1 and flushed[0].key == other


def test_policy_from_config_caps() -> None:
    p = BatchPolicy.from_config(BatchingConfig(max_delay_ms=7, min_size=2, max_size=32), endpoints=3)
    assert (p.max_delay_s, p.min_size, p.max_size, p.max_inflight) == (0.007, 2, 32, 3)
    assert HARD_CAP == 32


async def test_close_releases_everyone() -> None:
    b, flushed, _ = _batcher()
    ms = [b.join(KEY, SLOW, i, 1) for i in range(5)]
    await b.close()
    assert ms[1].future.result().role == "fallback" and ms[4].future.result().role == "fallback"


# ---------------------------------------------------------------- tensors


class _CountingBackend:
    name = "numpy"

    def __init__(self) -> None:
        self.calls = 0

    def preprocess(self, images, spec):
        self.calls += 1
        return preprocess(images, spec)


async def test_merge_batch_is_one_kernel_call_in_member_order() -> None:
    spec = PreprocessSpec.from_tensor_input(TensorInput(width=4, height=4))
    red, blue, green = (np.full((6, 5, 3), c, np.uint8) for c in ((255, 0, 0), (0, 0, 255), (0, 255, 0)))
    ready = preprocess([green], spec)
    b, flushed, _ = _batcher()
    b.join(KEY, SLOW, Job(rows=2, images=[red, blue]), 2)
    b.join(KEY, SLOW, Job(rows=1, tensor=ready), 1)
    b.join(KEY, SLOW, Job(rows=1, images=[blue]), 1)
    backend = _CountingBackend()
    merged = merge_batch(flushed[0], backend, spec)
    assert backend.calls == 1 and merged.shape == (4, 3, 4, 4)
    want = np.concatenate([preprocess([red, blue], spec), ready, preprocess([blue], spec)])
    np.testing.assert_allclose(merged, want, atol=1e-6)


# ---------------------------------------------------------------- sessions (flows) without Envoy

from pathlib import Path  # noqa: E402

import orjson  # noqa: E402
import yaml  # noqa: E402
from envoy.config.core.v3 import base_pb2  # noqa: E402
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb_ext  # noqa: E402

from adapters import kserve  # noqa: E402
from contracts.config import parse_config  # noqa: E402
from devstack.demo.kserve_server import ColourModel, read_input  # noqa: E402
from extproc.gateway import Gateway  # noqa: E402
from extproc.service import build_routes  # noqa: E402
from extproc.session import Session  # noqa: E402
from kernels import select_backend  # noqa: E402
from tests.core.session_driver import assert_refused_or_forwarded, body_msg, headers_msg, set_headers  # noqa: E402
from tests.stack_config import without_watermarks  # noqa: E402
from tests.vision.formgen import build_form  # noqa: E402
from tests.vision.imagegen import encode  # noqa: E402

ROUTES = build_routes()

ROOT = Path(__file__).resolve().parents[2]
RGB = {"red": (255, 0, 0), "green": (0, 255, 0), "blue": (0, 0, 255), "yellow": (255, 255, 0)}


@pytest.fixture
def vision_gateway() -> Gateway:
    data = without_watermarks(yaml.safe_load((ROOT / "modelyard.yaml").read_text()))
    # A wider window than the shipped 5 ms: two sessions started back to back must meet in one batch
    # even when a loaded machine (tests run three files at a time) delays the second.
    colors = next(m for m in data["models"] if m["name"] == "demo-colors")
    colors["batching"]["max_delay_ms"] = 200
    return Gateway.build(parse_config(data), batcher=Batcher(), image_backend=select_backend("cpu"))


async def _classify_session(gw: Gateway, colours: list[str]) -> tuple[Session, asyncio.Task]:
    body, ctype = build_form([("model", "demo-colors", None, None),
                              *[("image", encode(RGB[c], (9, 9)), f"{c}.png", None) for c in colours]])
    s = Session(gw, ROUTES)
    await s.handle(headers_msg({":method": "POST", ":path": "/v1/images/classify", "content-type": ctype,
                                "authorization": "Bearer sk-modelyard-demo"}))
    return s, asyncio.create_task(s.handle(body_msg(body)))


def _grpc_reply(upstream_body: bytes) -> tuple[bytes, int]:
    req = pb.ModelInferRequest.FromString(kserve.unframe(upstream_body))
    x = read_input(req)
    resp = pb.ModelInferResponse(model_name=req.model_name, id=req.id)
    resp.outputs.add(name="scores", datatype="FP32", shape=[x.shape[0], 8])
    resp.raw_output_contents.append(ColourModel().scores(x).astype("<f4").tobytes())
    return kserve.frame(resp.SerializeToString()), x.shape[0]


def _top1(body: bytes) -> list[str]:
    return [row["labels"][0]["label"] for row in orjson.loads(body)["results"]]


async def _leader_and_member(gw: Gateway, a: list[str], b: list[str]):
    sa, ta = await _classify_session(gw, a)
    sb, tb = await _classify_session(gw, b)
    done, _ = await asyncio.wait({ta, tb}, return_when=asyncio.FIRST_COMPLETED, timeout=5)
    assert len(done) == 1, "exactly one stream (the leader) leaves its request-body step"
    if ta in done:
        return (sa, ta, a), (sb, tb, b)
    return (sb, tb, b), (sa, ta, a)


async def test_leader_body_and_member_immediate(vision_gateway: Gateway) -> None:
    (ls, lt, lwant), (ms, mt, mwant) = await _leader_and_member(vision_gateway, ["red"], ["green", "blue"])
    up = lt.result().request_body.response
    reply, rows = _grpc_reply(up.body_mutation.body)
    assert rows == 3  # both requests in one merged call
    await ls.handle(headers_msg({":status": "200", "content-type": "application/grpc"}, response=True))
    rb = await ls.handle(body_msg(reply, response=True))
    assert _top1(rb.response_body.response.body_mutation.body) == lwant
    m = await asyncio.wait_for(mt, 5)
    assert m.immediate_response.status.code == 200
    assert _top1(m.immediate_response.body) == mwant


async def test_leader_grpc_error_sends_member_on_its_own(vision_gateway: Gateway) -> None:
    (ls, lt, _), (ms, mt, mwant) = await _leader_and_member(vision_gateway, ["red", "red"], ["yellow"])
    r = await ls.handle(headers_msg({":status": "200", "grpc-status": "14", "grpc-message": "down"}, response=True))
    assert set_headers(r.response_headers.response.header_mutation)[":status"] == "503"
    own = (await asyncio.wait_for(mt, 5)).request_body.response
    reply, rows = _grpc_reply(own.body_mutation.body)
    assert rows == len(mwant)  # its own images only (either stream may have led)
    await ms.handle(headers_msg({":status": "200", "content-type": "application/grpc"}, response=True))
    rb = await ms.handle(body_msg(reply, response=True))
    assert _top1(rb.response_body.response.body_mutation.body) == mwant


async def test_leader_stream_closing_sends_member_on_its_own(vision_gateway: Gateway) -> None:
    (ls, lt, _), (ms, mt, _) = await _leader_and_member(vision_gateway, ["red"], ["blue"])
    ls.close()  # Envoy ended the leader's stream before any reply
    own = (await asyncio.wait_for(mt, 5)).request_body.response
    assert _grpc_reply(own.body_mutation.body)[1] == 1


async def test_empty_reply_is_502_and_members_fall_back(vision_gateway: Gateway) -> None:
    (ls, lt, _), (ms, mt, _) = await _leader_and_member(vision_gateway, ["red"], ["blue"])
    await ls.handle(headers_msg({":status": "200", "content-type": "application/grpc"}, response=True))
    rb = await ls.handle(body_msg(b"", response=True))
    hs = {h.header.key: h.header.raw_value.decode() for h in rb.response_body.response.header_mutation.set_headers}
    assert hs[":status"] == "502" and b"without a reply" in rb.response_body.response.body_mutation.body
    assert (await asyncio.wait_for(mt, 5)).WhichOneof("response") == "request_body"


# ---------------------------------------------------------------- invariants under random operations

from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

_OPS = st.lists(st.one_of(st.tuples(st.just("join"), st.integers(1, 6)),
                          st.tuples(st.just("leave"), st.integers(0, 40)),
                          st.tuples(st.just("complete"), st.just(0)), st.tuples(st.just("fail"), st.just(0))),
                max_size=40)


@settings(max_examples=150, deadline=None)
@given(_OPS)
def test_every_member_gets_exactly_its_rows(ops) -> None:
    async def run() -> None:
        b, flushed, _ = _batcher()
        pol = BatchPolicy(max_delay_s=60, min_size=4, max_size=8, max_inflight=8)
        members = []
        for op, arg in ops:
            if op == "join":
                m = b.join(KEY, pol, len(members), arg)
                if m is not None:
                    members.append(m)
            elif op == "leave" and members:
                b.leave(members[arg % len(members)])
            else:
                live = [x for x in flushed if x.state == "dispatched"]
                if live:
                    (b.complete(live[0], "reply") if op == "complete" else b.fail(live[0], "no"))
        for batch in flushed:
            assert batch.rows <= pol.max_size
            start = 0
            for m in batch.members:
                assert m.start == start and m.batch is batch
                start += m.rows
            assert start == batch.rows
        await b.close()
        for m in members:
            if m.gone:
                continue
            assert m.future.done() and not m.future.cancelled()
            out = m.future.result()
            assert out.role in ("leader", "result", "fallback")
            if out.role == "result":
                assert out.start == m.start and m is not m.batch.leader
    asyncio.run(run())


# ---------------------------------------------------------------- the vision flows never fail on input


from hypothesis import HealthCheck  # noqa: E402

_IMAGES = st.one_of(st.binary(max_size=64), st.sampled_from([encode(), encode(fmt="JPEG"), encode(fmt="WEBP")]),
                    st.sampled_from([encode()[:60], encode(fmt="JPEG")[:300]]))
_FIELDS = st.lists(st.one_of(
    st.tuples(st.just("model"), st.sampled_from(["demo-colors", "demo-gpt", "nope", ""]), st.none(), st.none()),
    st.tuples(st.just("image"), _IMAGES, st.sampled_from(["a.png", None]), st.none()),
    st.tuples(st.just("top_k"), st.sampled_from(["1", "3", "0", "x", "99999"]), st.none(), st.none()),
), max_size=5)
_JSON = st.recursive(st.none() | st.booleans() | st.integers(-2**63, 2**64 - 1) | st.floats() | st.text(max_size=8),
                     lambda c: st.lists(c, max_size=4) | st.dictionaries(st.text(max_size=8), c, max_size=4),
                     max_leaves=16)
_TENSORS = st.fixed_dictionaries({
    "name": st.sampled_from(["input", "x", 3]), "datatype": st.sampled_from(["FP32", "FP16", "INT8", "BYTES", "Q"]),
    "shape": st.one_of(st.just([1, 3, 32, 32]), st.lists(st.integers(-1, 4), max_size=4), _JSON),
    "data": st.one_of(st.builds(lambda: [0.5] * 3072), st.lists(st.floats(), max_size=4), _JSON)})
_V2 = st.one_of(st.binary(max_size=100), _JSON.map(orjson.dumps),
                st.fixed_dictionaries({"inputs": st.lists(_TENSORS, max_size=2)},
                                      optional={"parameters": _JSON, "outputs": _JSON, "id": _JSON}).map(orjson.dumps))


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_vision_flows_never_fail_on_input(vision_gateway: Gateway, caplog, data) -> None:
    if data.draw(st.booleans()):
        path = "/v2/models/demo-colors/infer"
        body, ctype = data.draw(_V2), "application/json"
    else:
        path = "/v1/images/classify"
        body, ctype = build_form(data.draw(_FIELDS), boundary="fuzzb")
        ctype = data.draw(st.sampled_from([ctype, "multipart/form-data", "text/plain",
                                           "multipart/form-data; boundary=zz"]))

    assert_refused_or_forwarded(vision_gateway, caplog, {":method": "POST", ":path": path, "content-type": ctype,
                                                         "authorization": "Bearer sk-modelyard-demo"}, body, 5)


def _rest_gateway() -> Gateway:
    data = without_watermarks(yaml.safe_load((ROOT / "modelyard.yaml").read_text()))
    colors = next(m for m in data["models"] if m["name"] == "demo-colors")
    colors["deployments"] = [{"cluster": "rest-colors", "protocol": "kserve-rest", "upstream_model": "colors-v7",
                              "endpoints": ["127.0.0.1:9"]}]
    return Gateway.build(parse_config(data), batcher=Batcher(), image_backend=select_backend("cpu"))


async def test_v2_to_a_rest_upstream_passes_the_body_through() -> None:
    s = Session(_rest_gateway(), ROUTES)
    await s.handle(headers_msg({":method": "POST", ":path": "/v2/models/demo-colors/versions/2/infer",
                                "content-type": "application/json", "authorization": "Bearer sk-modelyard-demo"}))
    body = orjson.dumps({"inputs": [{"name": "input", "datatype": "FP32", "shape": [1, 3, 32, 32],
                                     "data": [0.0] * 3072}]})
    r = (await s.handle(body_msg(body))).request_body.response
    hs = {h.header.key: h.header.raw_value.decode() for h in r.header_mutation.set_headers}
    assert hs[":path"] == "/v2/models/colors-v7/versions/2/infer" and hs["x-modelyard-cluster"] == "rest-colors"
    assert hs["content-type"] == "application/json" and "te" not in hs
    assert "authorization" in r.header_mutation.remove_headers and r.body_mutation.body == body
    # A REST upstream's own error: its message, a 4xx kept, in KServe's shape.
    h = await s.handle(headers_msg({":status": "400", "content-type": "application/json"}, response=True))
    assert {x.header.key: x.header.raw_value.decode()
            for x in h.response_headers.response.header_mutation.set_headers}[":status"] == "400"
    b = await s.handle(body_msg(b'{"error": "bad tensor"}', response=True))
    err = orjson.loads(b.response_body.response.body_mutation.body)["error"]
    assert err.startswith("upstream error (HTTP 400): bad tensor (task ")


async def test_classify_needs_a_grpc_upstream() -> None:
    s, task = await _classify_session(_rest_gateway(), ["red"])
    r = await asyncio.wait_for(task, 5)
    assert r.immediate_response.status.code == 502
    assert b"kserve-grpc" in r.immediate_response.body


async def _v2_binary_session(gw: Gateway, colours: list[str]) -> tuple[Session, asyncio.Task]:
    """A tritonclient.http-style binary v2 request (binary input, every output binary)."""
    from tritonclient.http import InferenceServerClient, InferInput

    from contracts.config import TensorInput
    from kernels import PreprocessSpec, preprocess

    spec = PreprocessSpec.from_tensor_input(TensorInput(width=32, height=32, datatype="FP32"))
    x = preprocess([np.full((9, 9, 3), RGB[c], np.uint8) for c in colours], spec)
    inp = InferInput("input", list(x.shape), "FP32")
    inp.set_data_from_numpy(x)
    body, size = InferenceServerClient.generate_request_body([inp])
    s = Session(gw, ROUTES)
    await s.handle(headers_msg({":method": "POST", ":path": "/v2/models/demo-colors/infer",
                                "content-type": "application/octet-stream", "inference-header-content-length": str(size),
                                "authorization": "Bearer sk-modelyard-demo"}))
    return s, asyncio.create_task(s.handle(body_msg(body)))


def _binary_top1(body: bytes, length: str) -> list[str]:
    from tritonclient.http import InferenceServerClient

    scores = InferenceServerClient.parse_response_body(body, header_length=int(length)).as_numpy("scores")
    return [["red", "green", "blue", "white", "black", "yellow", "cyan", "magenta"][i] for i in scores.argmax(1)]


async def test_binary_v2_requests_batch_and_answer_binary(vision_gateway: Gateway) -> None:
    sa, ta = await _v2_binary_session(vision_gateway, ["red"])
    sb, tb = await _v2_binary_session(vision_gateway, ["green", "blue"])
    done, _ = await asyncio.wait({ta, tb}, return_when=asyncio.FIRST_COMPLETED, timeout=5)
    assert len(done) == 1, "one leader, one member"
    (ls, lt, lwant), (mt, mwant) = ((sa, ta, ["red"]), (tb, ["green", "blue"])) if ta in done \
        else ((sb, tb, ["green", "blue"]), (ta, ["red"]))
    reply, rows = _grpc_reply(lt.result().request_body.response.body_mutation.body)
    assert rows == 3  # both binary requests in one merged call
    await ls.handle(headers_msg({":status": "200", "content-type": "application/grpc"}, response=True))
    rb = (await ls.handle(body_msg(reply, response=True))).response_body.response
    hs = set_headers(rb.header_mutation)
    assert _binary_top1(rb.body_mutation.body, hs["inference-header-content-length"]) == lwant
    m = (await asyncio.wait_for(mt, 5)).immediate_response
    mh = set_headers(m.headers)
    assert m.status.code == 200 and _binary_top1(m.body, mh["inference-header-content-length"]) == mwant


async def _grpc_infer_session(gw: Gateway, colours: list[str], rid: str) -> tuple[Session, asyncio.Task]:
    """A tritonclient.grpc-style ModelInfer (raw contents) on the gateway's gRPC ingress."""
    from contracts.config import TensorInput
    from kernels import PreprocessSpec, preprocess

    x = preprocess([np.full((9, 9, 3), RGB[c], np.uint8) for c in colours],
                   PreprocessSpec.from_tensor_input(TensorInput(width=32, height=32, datatype="FP32")))
    req = pb.ModelInferRequest(model_name="demo-colors", id=rid)
    req.inputs.add(name="input", datatype="FP32", shape=list(x.shape))
    req.outputs.add(name="scores")
    req.raw_input_contents.append(x.astype("<f4").tobytes())
    s = Session(gw, ROUTES)
    await s.handle(headers_msg({":method": "POST", ":path": "/inference.GRPCInferenceService/ModelInfer",
                                "content-type": "application/grpc", "te": "trailers",
                                "authorization": "Bearer sk-modelyard-demo"}))
    return s, asyncio.create_task(s.handle(body_msg(kserve.frame(req.SerializeToString()))))


def _grpc_top1(framed: bytes) -> tuple[str, str, list[str]]:
    resp = pb.ModelInferResponse.FromString(kserve.unframe(framed))
    scores = np.frombuffer(resp.raw_output_contents[0], "<f4").reshape(list(resp.outputs[0].shape))
    names = ["red", "green", "blue", "white", "black", "yellow", "cyan", "magenta"]
    return resp.model_name, resp.id, [names[i] for i in scores.argmax(1)]


async def _grpc_leader_and_member(gw: Gateway):
    sa, ta = await _grpc_infer_session(gw, ["red"], "a")
    sb, tb = await _grpc_infer_session(gw, ["green", "blue"], "b")
    done, _ = await asyncio.wait({ta, tb}, return_when=asyncio.FIRST_COMPLETED, timeout=5)
    assert len(done) == 1, "one leader, one member"
    if ta in done:
        return (sa, ta, ("a", ["red"])), (sb, tb, ("b", ["green", "blue"]))
    return (sb, tb, ("b", ["green", "blue"])), (sa, ta, ("a", ["red"]))


async def test_grpc_member_goes_to_the_echo_with_its_slice(vision_gateway: Gateway) -> None:
    """A gRPC member is not answered with an immediate response (no message, no trailers there): its
    request goes on to the extproc's echo, carrying its slice, and the echoed reply passes as is."""
    from contracts.envoy_names import CLUSTER_HEADER, EXTPROC_CLUSTER
    from extproc.flows.kserve_grpc import SLICE_PATH

    (ls, lt, (lid, lwant)), (ms, mt, (mid, mwant)) = await _grpc_leader_and_member(vision_gateway)
    reply, rows = _grpc_reply(lt.result().request_body.response.body_mutation.body)
    assert rows == 3  # both callers in one merged call
    await ls.handle(headers_msg({":status": "200", "content-type": "application/grpc"}, response=True))
    rb = (await ls.handle(body_msg(reply, response=True))).response_body.response
    assert _grpc_top1(rb.body_mutation.body) == ("demo-colors", lid, lwant)
    m = (await asyncio.wait_for(mt, 5)).request_body.response
    sent = set_headers(m.header_mutation)
    assert sent[":path"] == SLICE_PATH and sent[CLUSTER_HEADER] == EXTPROC_CLUSTER and m.clear_route_cache
    assert _grpc_top1(m.body_mutation.body) == ("demo-colors", mid, mwant)  # the gateway's name, its own id
    # The echo's reply (what the extproc's own port returns) goes to the caller unchanged, OK in the trailers.
    await ms.handle(headers_msg({":status": "200", "content-type": "application/grpc"}, response=True))
    back = (await ms.handle(body_msg(m.body_mutation.body, response=True))).response_body.response
    assert not back.HasField("body_mutation")
    t = await ms.handle(pb_ext.ProcessingRequest(response_trailers=pb_ext.HttpTrailers(
        trailers=base_pb2.HeaderMap(headers=[base_pb2.HeaderValue(key="grpc-status", raw_value=b"0")]))))
    assert t.WhichOneof("response") == "response_trailers"
    ls.close()
    ms.close()


async def test_grpc_leader_error_sends_member_on_its_own(vision_gateway: Gateway) -> None:
    (ls, lt, _), (ms, mt, (mid, mwant)) = await _grpc_leader_and_member(vision_gateway)
    await ls.handle(headers_msg({":status": "200", "grpc-status": "14", "grpc-message": "down"}, response=True))
    own = (await asyncio.wait_for(mt, 5)).request_body.response
    assert set_headers(own.header_mutation)[":path"] == "/inference.GRPCInferenceService/ModelInfer"
    reply, rows = _grpc_reply(own.body_mutation.body)
    assert rows == len(mwant)  # its own rows only, to the deployment
    await ms.handle(headers_msg({":status": "200", "content-type": "application/grpc"}, response=True))
    rb = (await ms.handle(body_msg(reply, response=True))).response_body.response
    assert _grpc_top1(rb.body_mutation.body) == ("demo-colors", mid, mwant)
    ls.close()
    ms.close()


@pytest.mark.parametrize("shape", ["typed", "short"])
async def test_grpc_tensor_that_is_not_raw_or_lies_about_its_size_goes_alone(vision_gateway: Gateway,
                                                                               shape: str) -> None:
    """Typed `contents` or raw bytes of the wrong size never join a batch (nor fail in it): sent as is."""
    req = pb.ModelInferRequest(model_name="demo-colors", id="t")
    t = req.inputs.add(name="input", datatype="FP32", shape=[1, 3, 32, 32])
    if shape == "typed":
        t.contents.fp32_contents.extend([0.0] * 3 * 32 * 32)
    else:
        req.raw_input_contents.append(b"\x00" * 16)
    s = Session(vision_gateway, ROUTES)
    await s.handle(headers_msg({":method": "POST", ":path": "/inference.GRPCInferenceService/ModelInfer",
                                "content-type": "application/grpc", "authorization": "Bearer sk-modelyard-demo"}))
    r = await asyncio.wait_for(s.handle(body_msg(kserve.frame(req.SerializeToString()))), 1)  # no batch window
    sent = pb.ModelInferRequest.FromString(kserve.unframe(r.request_body.response.body_mutation.body))
    assert sent.id == "t" and sent.inputs[0].shape == [1, 3, 32, 32]
    assert vision_gateway.batcher is not None and not vision_gateway.batcher.queue_rows(
        BatchKey("demo-colors", "demo-kserve", (3, 32, 32), "FP32"))
    s.close()


async def test_a_member_that_can_answer_alone_leads_before_one_that_cannot() -> None:
    # A text batch's gRPC caller cannot answer on its own if the merged call is refused: a REST one leads.
    b, flushed, _ = _batcher()
    grpc_job, rest_job = Job(rows=1, answers_alone=False), Job(rows=1)
    ms = [b.join(KEY, SLOW, job, 1) for job in (grpc_job, rest_job, grpc_job, rest_job)]
    assert flushed and flushed[0].leader is ms[1]
    assert ms[1].future.result().role == "leader" and not ms[0].future.done()
    b.complete(flushed[0], "reply")  # the key is idle again: the next batch flushes at min_size
    only_grpc = [b.join(KEY, SLOW, grpc_job, 1) for _ in range(4)]
    assert flushed[1].leader is only_grpc[0]  # none can: the first leads, as before


def test_text_tensor_rows_merge_only_when_they_fit() -> None:
    from adapters.kserve import merge_tensor_requests, tensor_rows

    def req(texts: list[bytes], shape: list[int] | None = None, raw: bytes | None = None) -> pb.ModelInferRequest:
        r = pb.ModelInferRequest(model_name="m", id="caller")
        r.inputs.add(name="text", datatype="BYTES", shape=shape or [len(texts)])
        r.raw_input_contents.append(raw if raw is not None else b"".join(len(t).to_bytes(4, "little") + t
                                                                          for t in texts))
        return r

    a, b = tensor_rows(req([b"one"])), tensor_rows(req([b"two", b"three!"]))
    assert a is not None and b is not None and a.rows == 1 and b.rows == 2 and a.variant == b.variant
    merged = merge_tensor_requests(req([b"one"]), [a, b], "task")
    assert list(merged.inputs[0].shape) == [3] and merged.id == "task"
    assert merged.raw_input_contents[0] == req([b"one", b"two", b"three!"]).raw_input_contents[0]
    assert tensor_rows(req([b"one"], shape=[2])) is None  # the size lies: it goes alone
    assert tensor_rows(req([b"x"], raw=b"\x05\x00\x00\x00ab")) is None  # truncated
    ids = pb.ModelInferRequest(model_name="m")
    ids.inputs.add(name="ids", datatype="INT64", shape=[2, 3])
    ids.raw_input_contents.append(np.arange(6, dtype="<i8").tobytes())
    rows = tensor_rows(ids)
    assert rows is not None and rows.row_shape == (3,) and rows.datatype == "INT64"
    ids.parameters["priority"].int64_param = 1
    assert tensor_rows(ids) is None  # parameters: as sent, alone


PAD = BatchPadConfig(input="input_ids", mask="attention_mask", buckets=[16, 32, 64], pad_id=7,
                     outputs=["embedding"])


def _ids(n: int, length: int, *, outputs: tuple[str, ...] = ("embedding",), mask: bool = True,
         start: int = 1) -> pb.ModelInferRequest:
    r = pb.ModelInferRequest(model_name="m", id="caller")
    ids = np.arange(start, start + n * length, dtype="<i8").reshape(n, length)
    r.inputs.add(name="input_ids", datatype="INT64", shape=[n, length])
    r.raw_input_contents.append(ids.tobytes())
    if mask:
        r.inputs.add(name="attention_mask", datatype="INT64", shape=[n, length])
        r.raw_input_contents.append(np.ones((n, length), "<i8").tobytes())
    for o in outputs:
        r.outputs.add(name=o)
    return r


def test_token_ids_of_different_lengths_pad_to_one_bucket() -> None:
    from adapters.kserve import merge_tensor_requests, tensor_rows

    a, b = tensor_rows(_ids(1, 20), PAD), tensor_rows(_ids(2, 30, start=100), PAD)
    assert a is not None and b is not None
    # Same bucket (32), same inputs and outputs: the same batch key.
    assert (a.row_shape, a.datatype, a.variant) == (b.row_shape, b.datatype, b.variant) == ((32,), "INT64", a.variant)
    merged = merge_tensor_requests(_ids(1, 20), [a, b], "task", PAD)
    assert [list(t.shape) for t in merged.inputs] == [[3, 32], [3, 32]] and merged.id == "task"
    ids = np.frombuffer(merged.raw_input_contents[0], "<i8").reshape(3, 32)
    mask = np.frombuffer(merged.raw_input_contents[1], "<i8").reshape(3, 32)
    assert ids[0, :20].tolist() == list(range(1, 21)) and (ids[0, 20:] == 7).all()  # pad_id on the right
    assert ids[2, :30].tolist() == list(range(130, 160)) and (ids[1:, 30:] == 7).all()
    assert mask[0].tolist() == [1] * 20 + [0] * 12 and mask[1].tolist() == [1] * 30 + [0] * 2
    assert tensor_rows(_ids(1, 40), PAD).row_shape == (64,)  # the next bucket: another batch
    assert tensor_rows(_ids(1, 16), PAD).row_shape == (16,)  # a length on a bucket stays there


def test_padding_only_for_declared_per_sequence_outputs() -> None:
    from adapters.kserve import tensor_rows

    # Not padded, so (two inputs) not batched at all: past the largest bucket; an undeclared output
    # (it may depend on positions); no output named (every output, unknown ones too).
    assert tensor_rows(_ids(1, 65), PAD) is None
    assert tensor_rows(_ids(1, 20, outputs=("embedding", "token_logits")), PAD) is None
    assert tensor_rows(_ids(1, 20, outputs=()), PAD) is None
    unmasked = tensor_rows(_ids(1, 20, mask=False), PAD)  # no mask: merged as before, at equal length only
    assert unmasked is not None and unmasked.seq_len == 0 and unmasked.row_shape == (20,)
    no_mask = BatchPadConfig(input="input_ids", buckets=[32], outputs=["embedding"])
    assert tensor_rows(_ids(1, 20, mask=False), no_mask).seq_len == 20
    with pytest.raises(ValueError):
        BatchPadConfig(input="input_ids", buckets=[32])  # outputs undeclared: refused
    with pytest.raises(ValueError):
        BatchPadConfig(input="input_ids", buckets=[64, 32], outputs=["embedding"])


LENGTHS_PAD = BatchPadConfig(input="input_ids", lengths="seq_len", buckets=[16, 32], pad_id=7, outputs=["embedding"])


def _ids_with_lengths(n: int, length: int, lengths: list[int], *, start: int = 1, rank: int = 1,
                      datatype: str = "INT32") -> pb.ModelInferRequest:
    r = pb.ModelInferRequest(model_name="m", id="caller")
    r.inputs.add(name="seq_len", datatype=datatype, shape=[n] if rank == 1 else [n, 1])  # any input order
    r.raw_input_contents.append(np.array(lengths, "<i4" if datatype == "INT32" else "<i8").tobytes())
    r.inputs.add(name="input_ids", datatype="INT64", shape=[n, length])
    r.raw_input_contents.append(np.arange(start, start + n * length, dtype="<i8").tobytes())
    r.outputs.add(name="embedding")
    return r


def test_a_lengths_input_keeps_each_rows_own_length_when_padded() -> None:
    from adapters.kserve import merge_tensor_requests, tensor_rows

    a = tensor_rows(_ids_with_lengths(1, 20, [20]), LENGTHS_PAD)
    b = tensor_rows(_ids_with_lengths(2, 30, [30, 25], start=100), LENGTHS_PAD)  # the caller's own shorter row
    assert a is not None and b is not None and a.row_shape == b.row_shape == (32,) and a.variant == b.variant
    merged = merge_tensor_requests(_ids_with_lengths(1, 20, [20]), [a, b], "task", LENGTHS_PAD)
    assert [list(t.shape) for t in merged.inputs] == [[3], [3, 32]]
    assert np.frombuffer(merged.raw_input_contents[0], "<i4").tolist() == [20, 30, 25]  # per row, as sent
    ids = np.frombuffer(merged.raw_input_contents[1], "<i8").reshape(3, 32)
    assert ids[0, :20].tolist() == list(range(1, 21)) and (ids[0, 20:] == 7).all()
    assert ids[2, :30].tolist() == list(range(130, 160)) and (ids[1:, 30:] == 7).all()
    # [n, 1] lengths merge among themselves (another key), and keep their rank.
    c = tensor_rows(_ids_with_lengths(1, 10, [10], rank=2), LENGTHS_PAD)
    assert c is not None and c.variant != a.variant
    wide = merge_tensor_requests(_ids_with_lengths(1, 10, [10], rank=2), [c, c], "t", LENGTHS_PAD)
    assert list(wide.inputs[0].shape) == [2, 1] and list(wide.inputs[1].shape) == [2, 16]
    # Not padded: a length past its own sequence, a negative one, the wrong row count, no lengths input.
    assert tensor_rows(_ids_with_lengths(1, 20, [21]), LENGTHS_PAD) is None
    assert tensor_rows(_ids_with_lengths(1, 20, [-1]), LENGTHS_PAD) is None
    assert tensor_rows(_ids_with_lengths(2, 20, [20]), LENGTHS_PAD) is None
    assert tensor_rows(_ids(1, 20, mask=False), LENGTHS_PAD).seq_len == 0  # merged only at its exact length
    with pytest.raises(ValueError):
        BatchPadConfig(input="input_ids", lengths="input_ids", buckets=[32], outputs=["embedding"])


async def test_a_batch_leaves_max_delay_after_its_first_member_arrived() -> None:
    b = Batcher()
    policy = BatchPolicy(max_delay_s=0.05, min_size=4, max_size=8)
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    m = b.join(BatchKey("m", "c", (), "BYTES"), policy, Job(rows=1), 1, arrived=time.monotonic() - 0.04)
    assert m is not None
    assert (await b.wait(m, 1.0)).role == "leader"
    assert loop.time() - t0 < 0.04  # 10 ms left of the window, not 50
