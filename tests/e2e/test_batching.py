"""Dynamic batching through a real Envoy: own labels per caller, leader-failure fallback, leaving members.

One stack for the module: Envoy + extproc + the demo KServe server (own process, /stats and
/control). Three models on it: `colors-batched` (short window), `colors-wide` (a 1 s window, wide
enough on a loaded machine, and min_size 16, so every request fired together lands in one batch:
deterministic), `colors-single` (batching off), and `colors-one-slot` (batching on, `max_inflight: 1`:
requests that go alone hold its one slot).
"""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import httpx
import numpy as np
import pytest
import tritonclient.grpc as triton_grpc
from tritonclient.utils import InferenceServerException

from contracts.config import TensorInput
from kernels import PreprocessSpec, preprocess
from tests.conftest import DEMO_KEY
from tests.stack_config import until
from tests.vision_stack import COLOURS, LABELS, classify_form, demo_stats, vision_stack

pytestmark = pytest.mark.e2e

AUTH = {"authorization": f"Bearer {DEMO_KEY}"}
MODELS = {
    "colors-batched": {"enabled": True, "max_delay_ms": 30, "min_size": 4, "max_size": 16},
    "colors-wide": {"enabled": True, "max_delay_ms": 1000, "min_size": 16, "max_size": 16},
    "colors-single": None,
    "colors-down": {"enabled": True, "max_delay_ms": 200, "min_size": 16, "max_size": 16},  # nobody listens
    "colors-one-slot": {"enabled": True, "max_delay_ms": 30, "min_size": 4, "max_size": 4},
}
ONE_SLOT = f"kserve-{list(MODELS).index('colors-one-slot')}"  # its cluster (tests/vision_stack.py names them)


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory):
    with vision_stack(tmp_path_factory.mktemp("batching"), MODELS, ["--fixed-ms", "10", "--per-image-ms", "1"],
                      dead=frozenset({"colors-down"}), deployments={"colors-one-slot": {"max_inflight": 1}}) as s:
        yield s


def _classify(url: str, model: str, colours: list[str], timeout: float = 20, fmt: str = "PNG") -> httpx.Response:
    body, ctype = classify_form(model, colours, fmt)
    return httpx.post(f"{url}/v1/images/classify", content=body, headers={**AUTH, "content-type": ctype},
                      timeout=timeout)


def _infer(url: str, model: str, colours: list[str], *, version: str = "", size: int = 32,
           timeout: float = 20) -> httpx.Response:
    spec = PreprocessSpec.from_tensor_input(TensorInput(width=size, height=size))
    x = preprocess([np.full((9, 7, 3), COLOURS[c], np.uint8) for c in colours], spec)
    body = {"inputs": [{"name": "input", "datatype": "FP32", "shape": list(x.shape), "data": x.ravel().tolist()}]}
    path = f"/v2/models/{model}/versions/{version}/infer" if version else f"/v2/models/{model}/infer"
    return httpx.post(f"{url}{path}", json=body, headers=AUTH, timeout=timeout)


def _tensor(colours: list[str], size: int = 32) -> np.ndarray:
    spec = PreprocessSpec.from_tensor_input(TensorInput(width=size, height=size))
    return preprocess([np.full((9, 7, 3), COLOURS[c], np.uint8) for c in colours], spec)


def _grpc_infer(url: str, model: str, colours: list[str], request_id: str = "",
                version: str = "", size: int = 32) -> triton_grpc.InferResult:
    """tritonclient.grpc through the gateway's listener (gRPC ingress), binary raw contents as it sends them."""
    x = _tensor(colours, size)
    inp = triton_grpc.InferInput("input", list(x.shape), "FP32")
    inp.set_data_from_numpy(x)
    client = triton_grpc.InferenceServerClient(url.removeprefix("http://"))
    try:
        return client.infer(model, [inp], model_version=version, outputs=[triton_grpc.InferRequestedOutput("scores")],
                            request_id=request_id, headers=dict(AUTH), client_timeout=20)
    finally:
        client.close()


def _labels(r: httpx.Response) -> list[str]:
    assert r.status_code == 200, r.text
    doc = r.json()
    if "results" in doc:
        return [row["labels"][0]["label"] for row in doc["results"]]
    out = doc["outputs"][0]
    return [LABELS[i] for i in np.array(out["data"]).reshape(out["shape"]).argmax(1)]


def _together(calls: list) -> list:
    """Run the calls at the same moment (a barrier), each on its own thread."""
    gate = threading.Barrier(len(calls))

    def run(call):
        gate.wait()
        try:
            return call()
        except httpx.HTTPError as e:
            return e

    with ThreadPoolExecutor(len(calls)) as pool:
        return list(pool.map(run, calls))


def _metric(stack, name: str, model: str) -> float:
    text = httpx.get(f"http://{stack.cfg.extproc.metrics_address}/metrics", timeout=5).text
    for line in text.splitlines():
        if line.startswith(name) and f'model="{model}"' in line:
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def _served(stack, model: str) -> float:
    """modelyard_requests_total for the model, status 200, every cluster: each request metered as itself."""
    text = httpx.get(f"http://{stack.cfg.extproc.metrics_address}/metrics", timeout=5).text
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith("modelyard_requests_total{") and f'model="{model}"' in line and 'status="200"' in line)


def _wants(n: int) -> list[list[str]]:
    """Distinct label sequences, 1 to 3 images each."""
    return [[LABELS[(i + k * 3) % len(LABELS)] for k in range(1 + i % 3)] for i in range(n)]


def test_concurrent_callers_get_their_own_labels(stack) -> None:
    wants = _wants(10)
    before = demo_stats(stack)
    calls = [(lambda w=w, i=i: (_infer if i % 4 == 3 else _classify)(stack.url, "colors-batched", w))
             for i, w in enumerate(wants)]
    results = _together(calls)
    assert [_labels(r) for r in results] == wants
    after = demo_stats(stack)
    assert after["images"] - before["images"] == sum(map(len, wants))
    assert after["calls"] - before["calls"] < len(wants)  # merged calls
    assert _metric(stack, "modelyard_batch_size_count", "colors-batched") >= 1


def test_one_wide_batch_keeps_order_inside_each_request(stack) -> None:
    wants = [["red", "green", "blue"], ["yellow"], ["magenta", "cyan"], ["white", "black", "red", "blue"],
             ["green"]]
    before = demo_stats(stack)
    results = _together([lambda w=w: _classify(stack.url, "colors-wide", w, fmt="JPEG") for w in wants])
    assert [_labels(r) for r in results] == wants
    after = demo_stats(stack)
    assert after["calls"] - before["calls"] == 1 and after["images"] - before["images"] == 11


def test_leader_failure_falls_back_for_every_member(stack) -> None:
    wants = _wants(6)
    httpx.post(f"{stack.demo_stats}/control", json={"fail_next": 1}, timeout=5).raise_for_status()
    before = demo_stats(stack)
    fallbacks = _metric(stack, "modelyard_batch_fallbacks_total", "colors-wide")
    results = _together([lambda w=w: _classify(stack.url, "colors-wide", w) for w in wants])
    statuses = [r.status_code for r in results]
    # The leader carried the merged call and gets its error; everyone else made their own call.
    assert statuses.count(503) == 1, [r.text for r in results]
    for r, w in zip(results, wants):
        if r.status_code == 200:
            assert _labels(r) == w
    after = demo_stats(stack)
    assert after["failures"] - before["failures"] == 1
    assert after["calls"] - before["calls"] == len(wants) - 1
    assert _metric(stack, "modelyard_batch_fallbacks_total", "colors-wide") - fallbacks == len(wants) - 1


def test_cancelled_member_does_not_break_the_batch(stack) -> None:
    wants = _wants(5)
    before = demo_stats(stack)
    calls = [lambda w=w: _classify(stack.url, "colors-wide", w) for w in wants[:4]]
    calls.append(lambda: _classify(stack.url, "colors-wide", ["blue"] * 5, timeout=0.15))  # gives up mid-window
    results = _together(calls)
    assert isinstance(results[4], httpx.TimeoutException)
    assert [_labels(r) for r in results[:4]] == wants[:4]
    after = demo_stats(stack)
    assert after["calls"] - before["calls"] == 1
    # The member that left was dropped before the merged call: its 5 images never went upstream.
    assert after["images"] - before["images"] == sum(map(len, wants[:4]))


def test_batching_off_is_one_call_per_request(stack) -> None:
    wants = _wants(6)
    before = demo_stats(stack)
    results = _together([lambda w=w: _classify(stack.url, "colors-single", w) for w in wants])
    assert [_labels(r) for r in results] == wants
    after = demo_stats(stack)
    assert after["calls"] - before["calls"] == len(wants)
    assert _metric(stack, "modelyard_batch_size_count", "colors-single") == 0


def test_unreachable_upstream_answers_every_member(stack) -> None:
    # Envoy answers the leader's call itself (connect failure, 503): 502 to the client, as for chat;
    # members fall back and get the same answer from their own calls; nobody hangs, nobody sees a 500.
    results = _together([lambda w=w: _classify(stack.url, "colors-down", w) for w in _wants(3)])
    assert [r.status_code for r in results] == [502] * 3, [r.text for r in results]
    assert all("upstream error" in r.json()["error"]["message"] for r in results)
    assert _metric(stack, "modelyard_batch_fallbacks_total", "colors-down") == 2


def test_grpc_callers_join_one_batch_with_their_own_scores(stack) -> None:
    """tritonclient.grpc callers (and a REST one) fired together: one upstream call, and each gRPC
    caller gets a real gRPC reply (message + OK trailers) holding exactly the scores it gets alone."""
    wants = [["red", "green"], ["blue"], ["yellow", "cyan", "magenta"], ["white"], ["black", "red"]]
    alone = [_grpc_infer(stack.url, "colors-single", w).as_numpy("scores") for w in wants]
    before = demo_stats(stack)
    members = _metric(stack, "modelyard_batch_members_sum", "colors-wide")
    served = _served(stack, "colors-wide")
    calls = [lambda w=w, i=i: _grpc_infer(stack.url, "colors-wide", w, request_id=f"g-{i}")
             for i, w in enumerate(wants)]
    calls.append(lambda: _infer(stack.url, "colors-wide", ["green"]))
    results = _together(calls)
    after = demo_stats(stack)
    assert after["calls"] - before["calls"] == 1, results
    assert after["images"] - before["images"] == sum(map(len, wants)) + 1
    assert _metric(stack, "modelyard_batch_members_sum", "colors-wide") - members == len(calls)
    assert _served(stack, "colors-wide") - served == len(calls)  # members too, against the deployment
    assert 'cluster="modelyard-extproc"' not in httpx.get(
        f"http://{stack.cfg.extproc.metrics_address}/metrics", timeout=5).text  # the echo is no deployment
    for i, (res, w, own) in enumerate(zip(results[:-1], wants, alone)):
        assert isinstance(res, triton_grpc.InferResult), res
        scores = res.as_numpy("scores")
        assert scores.shape == (len(w), len(LABELS))
        np.testing.assert_allclose(scores, own, rtol=1e-6)  # its own rows, nobody else's
        assert [LABELS[k] for k in scores.argmax(1)] == w
        resp = res.get_response()
        assert resp.model_name == "colors-wide" and resp.id == f"g-{i}"
    assert _labels(results[-1]) == ["green"]


def test_grpc_leader_failure_falls_back_for_every_member(stack) -> None:
    wants = _wants(4)
    httpx.post(f"{stack.demo_stats}/control", json={"fail_next": 1}, timeout=5).raise_for_status()
    before = demo_stats(stack)

    def call(w: list[str]) -> object:
        try:
            return _grpc_infer(stack.url, "colors-wide", w)
        except InferenceServerException as e:
            return e

    results = _together([lambda w=w: call(w) for w in wants])
    errors = [r for r in results if isinstance(r, InferenceServerException)]
    assert len(errors) == 1 and errors[0].status() == "StatusCode.UNAVAILABLE", results  # the leader's own
    for r, w in zip(results, wants):
        if isinstance(r, triton_grpc.InferResult):
            assert [LABELS[k] for k in r.as_numpy("scores").argmax(1)] == w
    after = demo_stats(stack)
    assert after["failures"] - before["failures"] == 1
    assert after["calls"] - before["calls"] == len(wants) - 1


def test_versions_never_merge_and_each_merged_call_keeps_its_version(stack) -> None:
    """Image tensors for version 2 (REST and gRPC) and for no version, fired together at a model with a
    1 s window: one merged call per version, each sent under the version its callers asked for."""
    before = demo_stats(stack)
    calls = [lambda: _infer(stack.url, "colors-wide", ["red"], version="2"),
             lambda: _infer(stack.url, "colors-wide", ["green", "blue"], version="2"),
             lambda: _grpc_infer(stack.url, "colors-wide", ["yellow"], version="2"),
             lambda: _infer(stack.url, "colors-wide", ["cyan"]),
             lambda: _classify(stack.url, "colors-wide", ["magenta"])]
    results = _together(calls)
    assert [_labels(r) for r in results[:2]] == [["red"], ["green", "blue"]]
    assert isinstance(results[2], triton_grpc.InferResult), results[2]
    assert [LABELS[k] for k in results[2].as_numpy("scores").argmax(1)] == ["yellow"]
    assert [_labels(r) for r in results[3:]] == [["cyan"], ["magenta"]]
    after = demo_stats(stack)
    assert after["calls"] - before["calls"] == 2 and after["images"] - before["images"] == 6
    assert sorted(after["versions"][-2:]) == ["", "2"]


def _slot_metric(stack, name: str) -> float:
    """A series of colors-one-slot's deployment, summed over its other labels (tiers)."""
    text = httpx.get(f"http://{stack.cfg.extproc.metrics_address}/metrics", timeout=5).text
    return sum(float(ln.rsplit(" ", 1)[1]) for ln in text.splitlines()
               if ln.startswith(name + "{") and f'cluster="{ONE_SLOT}"' in ln)


def test_requests_that_cannot_batch_hold_a_slot(stack) -> None:
    """colors-one-slot batches and has max_inflight 1. A gRPC caller's tensor that cannot join a batch
    (64x64 for a 32x32 model) holds the one slot while upstream, so a request the batcher declines
    (5 rows, max_size 4) waits for it in the queue; a REST caller's 64x64 tensor holds it too, and
    gives it back when its client gives up."""
    control = f"{stack.demo_stats}/control"
    httpx.post(control, json={"fixed_ms": 1200}, timeout=5).raise_for_status()
    try:
        with ThreadPoolExecutor(2) as pool:
            first = pool.submit(_grpc_infer, stack.url, "colors-one-slot", ["red"], size=64)
            until(lambda: _slot_metric(stack, "modelyard_inflight") == 1)
            second = pool.submit(_infer, stack.url, "colors-one-slot", ["green"] * 5)
            until(lambda: _slot_metric(stack, "modelyard_queue_depth") == 1)
            assert _slot_metric(stack, "modelyard_inflight") == 1  # the one slot, still the first's
            one, two = first.result(), second.result()
        assert [LABELS[k] for k in one.as_numpy("scores").argmax(1)] == ["red"]
        assert _labels(two) == ["green"] * 5
        assert float(two.headers["x-modelyard-queue-wait-ms"]) > 0  # it waited for the first's slot
        until(lambda: _slot_metric(stack, "modelyard_inflight") == 0)
        with ThreadPoolExecutor(1) as pool:  # gives up while holding the slot
            gone = pool.submit(_infer, stack.url, "colors-one-slot", ["blue"], size=64, timeout=0.8)
            until(lambda: _slot_metric(stack, "modelyard_inflight") == 1)
            with pytest.raises(httpx.TimeoutException):
                gone.result()
    finally:
        httpx.post(control, json={"fixed_ms": 10}, timeout=5).raise_for_status()
    until(lambda: _slot_metric(stack, "modelyard_inflight") == 0)
    again = _infer(stack.url, "colors-one-slot", ["white"], size=64)  # the slot is free again
    assert _labels(again) == ["white"] and _slot_metric(stack, "modelyard_queue_depth") == 0


def test_service_still_serves_after_the_batching_tests(stack) -> None:
    assert _labels(_classify(stack.url, "colors-batched", ["cyan"])) == ["cyan"]
    assert _labels(_infer(stack.url, "colors-wide", ["yellow", "red"])) == ["yellow", "red"]
