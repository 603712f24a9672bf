"""The batcher's logic without Envoy: flush rules, leader/member outcomes, fallback, leaving members."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
from tritonclient.grpc import service_pb2 as pb

from extproc.batching import HARD_CAP, BatchKey, BatchPolicy, Batcher, slice_response
from extproc.config import BatchingConfig, TensorInput
from extproc.vision_flow import Job, merge_batch
from kernels import PreprocessSpec, preprocess

KEY = BatchKey("m", "c", (3, 4, 4), "FP32")
SLOW = BatchPolicy(max_delay_s=10.0, min_size=4, max_size=8)  # only size flushes within a test


def _batcher(**kw) -> tuple[Batcher, list, list]:
    flushed: list = []
    fallbacks: list = []
    b = Batcher(on_flush=flushed.append, on_fallback=lambda batch, n: fallbacks.append(n), **kw)
    return b, flushed, fallbacks


def _reply(rows: int, classes: int = 3) -> pb.ModelInferResponse:
    resp = pb.ModelInferResponse(model_name="m", model_version="1", id="lead")
    resp.outputs.add(name="scores", datatype="FP32", shape=[rows, classes])
    resp.raw_output_contents.append(np.arange(rows * classes, dtype="<f4").tobytes())
    return resp


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


def test_slice_response_rows() -> None:
    resp = _reply(5)
    resp.outputs.add(name="names", datatype="BYTES", shape=[5, 1])
    resp.raw_output_contents.append(b"".join(len(s).to_bytes(4, "little") + s for s in
                                             [b"a", b"bb", b"c", b"dd", b"e"]))
    part = slice_response(resp, 1, 3, total=5, request_id="mine")
    assert part.id == "mine" and list(part.outputs[0].shape) == [3, 3]
    got = np.frombuffer(part.raw_output_contents[0], "<f4").reshape(3, 3)
    assert (got == np.arange(15, dtype="<f4").reshape(5, 3)[1:4]).all()
    from adapters import kserve

    assert kserve.output_array(part, 1) == ["bb", "c", "dd"]


def test_slice_response_refuses_wrong_row_count() -> None:
    with pytest.raises(ValueError):
        slice_response(_reply(4), 0, 1, total=5)


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
