"""Text batched across callers (docs/batching.md "Embeddings", "KServe text tensors") through a real
Envoy: `openai` SDK callers of two tenants (and a Gemini-shaped caller) become fewer upstream calls,
counted at the demo upstream, each caller answered with exactly its own vectors, metered for its own
inputs; a caller's input the upstream refuses fails that caller alone, whether it led the batch or
waited in it. KServe v2 BYTES tensors from REST and tritonclient.grpc callers to a KServe gRPC text
model (the demo KServe server in its own process) are batched and split the same way."""

from __future__ import annotations

import asyncio
import sqlite3
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import numpy as np
import openai
import pytest
import tritonclient.grpc as triton_grpc
import tritonclient.http as triton_http
import yaml
from tritonclient.utils import InferenceServerException

from adapters.embeddings import EmbeddingRequest, estimate_tokens
from devstack.demo.behaviour import demo_embedding
from devstack.demo.faults import BAD_INPUT
from extproc.flows.offload import INLINE_PARSE_BYTES
from tests.conftest import DEMO_KEY
from tests.e2e.metered import metered_row
from tests.stack_config import ROOT, _remap, _static_envoy, free_port, start_stack, until, without_mcp

pytestmark = pytest.mark.e2e
MODEL = "demo-embed-batched"
CALLERS = 16
L2_KEY = "sk-modelyard-demo-l2"
GEMINI_MODEL = "embed-batched-gemini"
TEXT_MODEL = "text-kserve"  # a KServe v2 text model: BYTES in, the demo embedding (8 dims) out
TEXT_CALLERS = 8
TOKENS_MODEL = "tokens-kserve"  # the same text model fed token ids: padded to buckets (batching.pad)
LENGTHS_MODEL = "tokens-lengths"  # token ids with a per-sequence lengths input (batching.pad.lengths)
REST_TEXT_MODEL = "text-kserve-rest"  # the same text model behind the demo's KServe v2 REST front
ONE_SLOT_MODEL, ONE_SLOT = "embed-one-slot", "demo-embed-one-slot"  # its model and cluster


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory):
    data = without_mcp(yaml.safe_load((ROOT / "modelyard.yaml").read_text()))
    data["models"] = [m for m in data["models"] if m["name"] == MODEL]
    # A window long enough that a burst on a busy box lands in one batch: the count below is then exact.
    data["models"][0]["batching"] = {"max_delay_ms": 1000, "min_size": CALLERS, "max_size": 32}
    data.pop("ratelimit", None)
    data = _remap(data, {})
    data["listener"]["port"] = free_port()
    # The same batching in front of a Gemini-speaking upstream (batchEmbedContents; no usage reported).
    data["models"].append({**data["models"][0], "name": GEMINI_MODEL, "deployments": [
        {"cluster": "demo-gemini-batch", "protocol": "gemini", "endpoints": [f"127.0.0.1:{free_port()}"]}]})
    # The same upstream with one slot (max_inflight 1): requests the batcher declines (over max_size) hold it.
    data["models"].append({**data["models"][0], "name": ONE_SLOT_MODEL,
                           "batching": {"max_delay_ms": 5, "min_size": 2, "max_size": 4},
                           "deployments": [{**data["models"][0]["deployments"][0], "cluster": ONE_SLOT,
                                            "max_inflight": 1}]})
    kserve, kstats = free_port(), free_port()
    data["models"].append({
        "name": TEXT_MODEL, "task_types": ["infer"], "capabilities": {"streaming": False},
        "batching": {"max_delay_ms": 1000, "min_size": TEXT_CALLERS, "max_size": 32},
        "deployments": [{"cluster": "text-kserve", "protocol": "kserve-grpc", "upstream_model": "demo-text",
                         "endpoints": [f"127.0.0.1:{kserve}"]}]})
    data["models"].append({
        "name": TOKENS_MODEL, "task_types": ["infer"], "capabilities": {"streaming": False},
        "batching": {"max_delay_ms": 1000, "min_size": 2, "max_size": 32,
                     "pad": {"input": "input_ids", "mask": "attention_mask", "buckets": [16, 32, 64, 128],
                             "pad_id": 0, "outputs": ["embedding"]}},
        "deployments": [{"cluster": "tokens-kserve", "protocol": "kserve-grpc", "upstream_model": "demo-text",
                         "endpoints": [f"127.0.0.1:{kserve}"]}]})
    data["models"].append({
        "name": LENGTHS_MODEL, "task_types": ["infer"], "capabilities": {"streaming": False},
        "batching": {"max_delay_ms": 1000, "min_size": 4, "max_size": 32,  # 3 rows below: they wait for the window
                     "pad": {"input": "input_ids", "lengths": "seq_len", "buckets": [16, 32, 64, 128],
                             "pad_id": 0, "outputs": ["embedding"]}},
        "deployments": [{"cluster": "tokens-lengths", "protocol": "kserve-grpc", "upstream_model": "demo-text",
                         "endpoints": [f"127.0.0.1:{kserve}"]}]})
    data["models"].append({
        "name": REST_TEXT_MODEL, "task_types": ["infer"], "capabilities": {"streaming": False},
        "batching": {"max_delay_ms": 1000, "min_size": TEXT_CALLERS, "max_size": 32},
        "deployments": [{"cluster": "text-kserve-rest", "protocol": "kserve-rest", "upstream_model": "demo-text",
                         "endpoints": [f"127.0.0.1:{kstats}"]}]})
    _static_envoy(data)
    stack = start_stack(tmp_path_factory.mktemp("embed-batch"), data)
    from devstack.launcher import Child

    argv = [sys.executable, "-m", "devstack.demo.kserve_server", "--port", str(kserve), "--stats-port", str(kstats),
            "--models", "demo-text"]
    stack.children.insert(0, Child("kserve-demo", argv, ("http", f"http://127.0.0.1:{kstats}/stats")))
    with stack as s:
        s.upstream = f"http://{data['models'][0]['deployments'][0]['endpoints'][0]}"
        s.kserve_stats = f"http://127.0.0.1:{kstats}/stats"
        yield s


def _upstream_calls(stack) -> int:
    return int(httpx.get(f"{stack.upstream}/stats", timeout=5).json()["requests"])


def _expected(texts: list[str]) -> np.ndarray:
    return np.array([demo_embedding(t, None) for t in texts], np.float32)


def _client(stack, key: str = DEMO_KEY) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=f"{stack.url}/v1", api_key=key, max_retries=0, timeout=30)


def test_concurrent_callers_share_upstream_calls_and_get_their_own_vectors(stack) -> None:
    # Callers of two tenants, one or two inputs each, float or base64, and one Gemini-shaped caller.
    texts = [[f"caller {i} says hello"] + ([f"and a second text from {i}"] if i % 3 == 0 else [])
             for i in range(CALLERS - 1)]

    async def openai_call(i: int):
        client = _client(stack, L2_KEY if i % 2 else DEMO_KEY)
        inp = texts[i] if len(texts[i]) > 1 else texts[i][0]
        return await client.embeddings.with_raw_response.create(
            model=MODEL, input=inp, encoding_format="float" if i % 4 == 1 else openai.NOT_GIVEN)  # the SDK's own: base64

    async def gemini_call():
        async with httpx.AsyncClient(timeout=30) as http:
            return await http.post(f"{stack.url}/v1beta/models/{MODEL}:embedContent",
                                   headers={"x-goog-api-key": DEMO_KEY},
                                   json={"content": {"parts": [{"text": "the gemini caller"}]}})

    async def burst():
        return await asyncio.gather(*(openai_call(i) for i in range(CALLERS - 1)), gemini_call())

    before = _upstream_calls(stack)
    *raws, gem = asyncio.run(burst())
    calls = _upstream_calls(stack) - before
    assert calls < CALLERS, f"{CALLERS} callers made {calls} upstream calls"
    assert gem.status_code == 200, gem.text
    assert np.array_equal(np.array(gem.json()["embedding"]["values"], np.float32), _expected(["the gemini caller"])[0])
    total = 0
    for i, raw in enumerate(raws):
        out = raw.parse()
        got = np.array([d.embedding for d in out.data], np.float32)
        assert [d.index for d in out.data] == list(range(len(texts[i])))
        assert np.array_equal(got, _expected(texts[i])), f"caller {i} got someone else's vectors"
        assert out.model == MODEL and out.usage.prompt_tokens > 0
        total += out.usage.prompt_tokens
        # Each caller metered under its own tenant, for the tokens its answer reports.
        task = raw.headers["x-modelyard-task-id"]
        row = metered_row(stack, task)
        assert row[0] == MODEL and row[2] == 200 and row[3] == out.usage.prompt_tokens
        with sqlite3.connect(stack.cfg.extproc.metering_db) as conn:
            tenant, = conn.execute("SELECT tenant FROM requests WHERE task_id = ?", (task,)).fetchone()
        assert tenant == ("demo-l2" if i % 2 else "demo")
    # The demo reports words; the shares of the OpenAI callers and the Gemini caller sum to them.
    gem_row = metered_row(stack, gem.headers["x-modelyard-task-id"])
    gemini_text = "the gemini caller"
    words = sum(len(t.split()) for ts in [*texts, [gemini_text]] for t in ts)
    assert total + gem_row[3] == words


def test_a_large_merged_answer_read_off_the_loop_is_split_exactly(stack) -> None:
    # 8 x 2048 floats as base64 (87 KB): past the 64 KB inline limit, the merged answer is read in a worker thread.
    texts = [f"wide vector {i}" for i in range(8)]
    wide = 2048
    assert 8 * wide * 4 * 4 // 3 > INLINE_PARSE_BYTES

    async def burst():
        client = _client(stack)
        return await asyncio.gather(*(client.embeddings.create(model=MODEL, input=t, dimensions=wide)
                                      for t in texts))

    before = _upstream_calls(stack)
    outs = asyncio.run(burst())
    assert _upstream_calls(stack) - before < len(texts)
    for t, out in zip(texts, outs, strict=True):
        assert np.array_equal(np.array(out.data[0].embedding, np.float32), demo_embedding(t, wide))


async def _with_bad(stack, bad_first: bool) -> tuple[list, object]:
    good = [f"good text number {i}" for i in range(3)]
    client = _client(stack)

    async def call(text: str):
        try:
            return await client.embeddings.create(model=MODEL, input=text)
        except openai.BadRequestError as e:
            return e

    bad = asyncio.ensure_future(call(f"this one is {BAD_INPUT}")) if bad_first else None
    await asyncio.sleep(0.3 if bad_first else 0)  # the first to arrive leads the batch
    goods = [asyncio.ensure_future(call(t)) for t in good]
    if not bad_first:
        await asyncio.sleep(0.3)
        bad = asyncio.ensure_future(call(f"this one is {BAD_INPUT}"))
    assert bad is not None
    outs = await asyncio.gather(*goods)
    for text, out in zip(good, outs, strict=True):
        assert isinstance(out, openai.types.CreateEmbeddingResponse), out
        assert np.array_equal(np.array(out.data[0].embedding, np.float32), _expected([text])[0])
    return outs, await bad


@pytest.mark.parametrize("bad_first", [True, False], ids=["bad-leader", "bad-member"])
def test_a_refused_input_fails_only_its_own_caller(stack, bad_first: bool) -> None:
    before = _upstream_calls(stack)
    t0 = time.monotonic()
    _, bad = asyncio.run(_with_bad(stack, bad_first))
    assert isinstance(bad, openai.BadRequestError) and bad.status_code == 400
    assert "refused on purpose" in str(bad)
    # One merged call (refused), then each caller's own: 1 + 4.
    assert _upstream_calls(stack) - before == 5
    assert time.monotonic() - t0 < 10


def test_a_gemini_upstream_gets_one_merged_call_and_each_caller_its_estimate(stack) -> None:
    texts = [f"gemini bound text number {i}" for i in range(6)]
    upstream = f"http://{stack.cfg.clusters()['demo-gemini-batch'].endpoints[0]}/stats"
    before = httpx.get(upstream, timeout=5).json()["requests"]

    async def burst():
        client = _client(stack)
        return await asyncio.gather(*(client.embeddings.create(model=GEMINI_MODEL, input=t) for t in texts))

    outs = asyncio.run(burst())
    assert httpx.get(upstream, timeout=5).json()["requests"] - before < len(texts)
    for t, out in zip(texts, outs, strict=True):
        assert np.array_equal(np.array(out.data[0].embedding, np.float32), _expected([t])[0])
        # Gemini reports no usage: each caller is charged its own estimate, as alone.
        assert out.usage.prompt_tokens == estimate_tokens(EmbeddingRequest(GEMINI_MODEL, (t,)))


def _text_rows(texts: list[str]) -> np.ndarray:
    return np.array([demo_embedding(t, 8) for t in texts], np.float32)


def _rest_text(stack, texts: list[str], model: str = TEXT_MODEL) -> httpx.Response:
    body = {"id": f"rest-{texts[0]}", "inputs": [{"name": "text", "datatype": "BYTES", "shape": [len(texts)],
                                                  "data": texts}],
            "outputs": [{"name": "embedding"}]}
    return httpx.post(f"{stack.url}/v2/models/{model}/infer", json=body, timeout=30,
                      headers={"authorization": f"Bearer {DEMO_KEY}"})


def _grpc_text_or_error(stack, texts: list[str], model: str = TEXT_MODEL) -> triton_grpc.InferResult | InferenceServerException:
    try:
        return _grpc_text(stack, texts, model)
    except InferenceServerException as e:
        return e


def _statuses(db: str, query: str, model: str, since: float, count: int, settle: float, timeout: float) -> list[int]:
    """The statuses `query` finds for `model` since `since` (wall clock), once `count` are there (a row the
    writer commits late for an earlier test is older than `since`); `settle` outlasts the writer's gathering,
    so a second row for one caller would show by then."""
    deadline = time.monotonic() + timeout
    while True:
        with sqlite3.connect(db) as conn:
            rows = [r[0] for r in conn.execute(query, (model, since))]
        if len(rows) >= count or time.monotonic() > deadline:
            time.sleep(settle)
            with sqlite3.connect(db) as conn:
                return sorted(r[0] for r in conn.execute(query, (model, since)))
        time.sleep(0.05)


def _metered_statuses(stack, model: str, since: float, count: int, timeout: float = 5.0) -> list[int]:
    # The metering writer gathers rows for 100 ms.
    return _statuses(stack.cfg.extproc.metering_db, "SELECT status FROM requests WHERE model = ? AND ts >= ?",
                     model, since, count, 0.3, timeout)


def _audited_statuses(stack, model: str, since: float, count: int, timeout: float = 5.0) -> list[int]:
    # The audit writer gathers rows for 200 ms.
    return _statuses(stack.cfg.extproc.audit_db, "SELECT status FROM audit WHERE model = ? AND time >= ?",
                     model, since, count, 0.4, timeout)


def _grpc_text(stack, texts: list[str], model: str = TEXT_MODEL) -> triton_grpc.InferResult:
    inp = triton_grpc.InferInput("text", [len(texts)], "BYTES")
    inp.set_data_from_numpy(np.array([t.encode() for t in texts], dtype=np.object_))
    client = triton_grpc.InferenceServerClient(stack.url.removeprefix("http://"))
    try:
        return client.infer(model, [inp], outputs=[triton_grpc.InferRequestedOutput("embedding")],
                            request_id=f"grpc-{texts[0]}", headers={"authorization": f"Bearer {DEMO_KEY}"},
                            client_timeout=30)
    finally:
        client.close()


def test_kserve_text_tensors_from_rest_and_grpc_callers_share_upstream_calls(stack) -> None:
    texts = [[f"kserve text {i}"] + ([f"and its second row {i}"] if i % 3 == 0 else []) for i in range(TEXT_CALLERS)]
    before = httpx.get(stack.kserve_stats, timeout=5).json()["calls"]
    with ThreadPoolExecutor(TEXT_CALLERS) as pool:
        futures = [pool.submit(_grpc_text if i % 2 else _rest_text, stack, t) for i, t in enumerate(texts)]
        results = [f.result() for f in futures]
    calls = httpx.get(stack.kserve_stats, timeout=5).json()["calls"] - before
    assert calls < TEXT_CALLERS, f"{TEXT_CALLERS} callers made {calls} upstream calls"
    for i, (t, res) in enumerate(zip(texts, results, strict=True)):
        if i % 2:
            got, rid = res.as_numpy("embedding"), res.get_response().id
            assert rid == f"grpc-{t[0]}"
        else:
            assert res.status_code == 200, res.text
            doc = res.json()
            out = doc["outputs"][0]
            assert doc["model_name"] == TEXT_MODEL and doc["id"] == f"rest-{t[0]}" and out["shape"] == [len(t), 8]
            got = np.array(out["data"], np.float32).reshape(out["shape"])
        assert np.array_equal(got, _text_rows(t)), f"caller {i} got someone else's rows"


@pytest.mark.parametrize("bad_first", [True, False], ids=["bad-leader", "bad-member"])
def test_a_refused_text_tensor_fails_only_its_own_caller(stack, bad_first: bool) -> None:
    good = [[f"good kserve text {i}"] for i in range(3)]
    bad = [f"this text is {BAD_INPUT}"]
    before = httpx.get(stack.kserve_stats, timeout=5).json()
    with ThreadPoolExecutor(4) as pool:
        first = pool.submit(_rest_text, stack, bad if bad_first else good[0])
        time.sleep(0.3)  # the first to arrive leads the batch
        # The last good caller speaks gRPC (tritonclient): a REST member leads before it, and it falls back alike.
        rest = [pool.submit(_grpc_text if t is good[2] else _rest_text, stack, t)
                for t in (good if bad_first else [*good[1:], bad])]
        answers = [first.result(), *(f.result() for f in rest)]
    after = httpx.get(stack.kserve_stats, timeout=5).json()
    by_text = dict(zip([bad[0], *(t[0] for t in good)] if bad_first else [good[0][0], good[1][0], good[2][0], bad[0]],
                       answers, strict=True))
    r = by_text.pop(bad[0])
    assert r.status_code == 400 and "refused on purpose" in r.text
    for text, r in by_text.items():
        if isinstance(r, triton_grpc.InferResult):
            got = r.as_numpy("embedding")
        else:
            assert r.status_code == 200, r.text
            got = np.array(r.json()["outputs"][0]["data"], np.float32).reshape(1, 8)
        assert np.array_equal(got, _text_rows([text]))
    # The merged call and the bad caller's own were refused; the three good callers' own calls answered.
    assert after["failures"] - before["failures"] == 2 and after["calls"] - before["calls"] == 3


def test_grpc_callers_only_share_one_call_made_by_the_extproc(stack) -> None:
    # No REST caller to lead: the extproc makes the merged call, every gRPC caller gets its slice.
    texts = [[f"grpc only text {i}"] + ([f"its second row {i}"] if i == 2 else []) for i in range(4)]
    before, mark = httpx.get(stack.kserve_stats, timeout=5).json()["calls"], time.time()
    with ThreadPoolExecutor(len(texts)) as pool:
        results = list(pool.map(lambda t: _grpc_text(stack, t), texts))
    assert httpx.get(stack.kserve_stats, timeout=5).json()["calls"] - before == 1
    for t, res in zip(texts, results, strict=True):
        assert res.get_response().id == f"grpc-{t[0]}" and res.get_response().model_name == TEXT_MODEL
        assert np.array_equal(res.as_numpy("embedding"), _text_rows(t))
    # Each caller metered and audited once, as itself (the extproc's own call is nobody's row).
    assert _metered_statuses(stack, TEXT_MODEL, mark, len(texts)) == [200] * len(texts)
    assert _audited_statuses(stack, TEXT_MODEL, mark, len(texts)) == [200] * len(texts)


@pytest.mark.parametrize("bad_first", [True, False], ids=["bad-first", "bad-last"])
def test_a_refused_input_of_grpc_callers_only_fails_its_own_caller(stack, bad_first: bool) -> None:
    good = [[f"good grpc text {i}"] for i in range(3)]
    bad = [f"grpc text {BAD_INPUT}"]
    order = [bad, *good] if bad_first else [*good, bad]
    before, mark = httpx.get(stack.kserve_stats, timeout=5).json(), time.time()
    with ThreadPoolExecutor(4) as pool:
        first = pool.submit(_grpc_text_or_error, stack, order[0])
        time.sleep(0.3)  # the first to arrive would lead the batch
        rest = [pool.submit(_grpc_text_or_error, stack, t) for t in order[1:]]
        answers = [first.result(), *(f.result() for f in rest)]
    after = httpx.get(stack.kserve_stats, timeout=5).json()
    for t, res in zip(order, answers, strict=True):
        if t is bad:
            assert isinstance(res, InferenceServerException), res
            assert res.status() == "StatusCode.INVALID_ARGUMENT" and "refused on purpose" in res.message()
        else:
            assert isinstance(res, triton_grpc.InferResult), res
            assert res.get_response().id == f"grpc-{t[0]}" and np.array_equal(res.as_numpy("embedding"), _text_rows(t))
    # The merged call and the bad caller's own were refused; the three good callers' own calls answered.
    assert after["failures"] - before["failures"] == 2 and after["calls"] - before["calls"] == 3
    assert _metered_statuses(stack, TEXT_MODEL, mark, 4) == [200, 200, 200, 400]
    assert _audited_statuses(stack, TEXT_MODEL, mark, 4) == [200, 200, 200, 400]


def _rest_answer_rows(r: httpx.Response, texts: list[str]) -> np.ndarray:
    assert r.status_code == 200, r.text
    doc = r.json()
    out = doc["outputs"][0]
    assert doc["model_name"] == REST_TEXT_MODEL and doc["id"] == f"rest-{texts[0]}" and out["shape"] == [len(texts), 8]
    return np.array(out["data"], np.float32).reshape(out["shape"])


def _binary_rest_text(stack, texts: list[str]) -> triton_http.InferResult:
    """tritonclient.http: binary tensors in, the output asked for as binary."""
    inp = triton_http.InferInput("text", [len(texts)], "BYTES")
    inp.set_data_from_numpy(np.array([t.encode() for t in texts], dtype=np.object_), binary_data=True)
    client = triton_http.InferenceServerClient(stack.url.removeprefix("http://"), network_timeout=30)
    try:
        return client.infer(REST_TEXT_MODEL, [inp], outputs=[triton_http.InferRequestedOutput("embedding", binary_data=True)],
                            request_id=f"rest-{texts[0]}", headers={"authorization": f"Bearer {DEMO_KEY}"})
    finally:
        client.close()


def test_kserve_rest_text_deployment_batches_rest_callers(stack) -> None:
    # JSON callers, a tritonclient.http caller with binary tensors (answered in binary, as it asked)
    # and two tritonclient.grpc callers (answered through the echo; alone they take the bridge hop).
    texts = [[f"rest upstream text {i}"] + ([f"and row two {i}"] if i % 3 == 0 else []) for i in range(6)]

    def call(i: int):
        if i == 3:
            return _binary_rest_text(stack, texts[i])
        if i in (1, 4):
            return _grpc_text(stack, texts[i], REST_TEXT_MODEL)
        return _rest_text(stack, texts[i], REST_TEXT_MODEL)

    before, mark = httpx.get(stack.kserve_stats, timeout=5).json()["calls"], time.time()
    with ThreadPoolExecutor(len(texts)) as pool:
        results = list(pool.map(call, range(len(texts))))
    assert httpx.get(stack.kserve_stats, timeout=5).json()["calls"] - before == 1
    for t, r in zip(texts, results, strict=True):
        if isinstance(r, triton_grpc.InferResult):
            assert r.get_response().id == f"grpc-{t[0]}" and r.get_response().model_name == REST_TEXT_MODEL
            got = r.as_numpy("embedding")
        elif isinstance(r, triton_http.InferResult):
            doc = r.get_response()
            assert doc["id"] == f"rest-{t[0]}" and "binary_data_size" in doc["outputs"][0]["parameters"]
            got = r.as_numpy("embedding")
        else:
            got = _rest_answer_rows(r, t)
        assert np.array_equal(got, _text_rows(t)), "a caller got someone else's rows"
    assert _metered_statuses(stack, REST_TEXT_MODEL, mark, len(texts)) == [200] * len(texts)


def test_a_failed_merged_call_of_grpc_callers_sends_each_on_its_own(stack) -> None:
    # The extproc's merged call answered UNAVAILABLE: every caller makes its own call and gets its own rows.
    texts = [[f"unlucky grpc text {i}"] for i in range(3)]
    httpx.post(stack.kserve_stats.removesuffix("/stats") + "/control", json={"fail_next": 1}, timeout=5).raise_for_status()
    before = httpx.get(stack.kserve_stats, timeout=5).json()
    with ThreadPoolExecutor(len(texts)) as pool:
        results = list(pool.map(lambda t: _grpc_text(stack, t), texts))
    after = httpx.get(stack.kserve_stats, timeout=5).json()
    for t, res in zip(texts, results, strict=True):
        assert res.get_response().id == f"grpc-{t[0]}" and np.array_equal(res.as_numpy("embedding"), _text_rows(t))
    assert after["failures"] - before["failures"] == 1 and after["calls"] - before["calls"] == len(texts)


def test_a_refused_input_to_a_kserve_rest_deployment_fails_only_its_caller(stack) -> None:
    # The bad REST caller first, then two good REST callers and a good gRPC one; then the same with
    # the bad caller on gRPC (its own call through the bridge hop: the upstream's 400 as INVALID_ARGUMENT).
    good = [[f"good rest upstream text {i}"] for i in range(3)]
    bad = [f"rest text {BAD_INPUT}"]
    before = httpx.get(stack.kserve_stats, timeout=5).json()
    with ThreadPoolExecutor(4) as pool:
        first = pool.submit(_rest_text, stack, bad, REST_TEXT_MODEL)
        time.sleep(0.3)
        rest = [pool.submit(_grpc_text, stack, t, REST_TEXT_MODEL) if t is good[2] else
                pool.submit(_rest_text, stack, t, REST_TEXT_MODEL) for t in good]
        answers = [first.result(), *(f.result() for f in rest)]
    after = httpx.get(stack.kserve_stats, timeout=5).json()
    assert answers[0].status_code == 400 and "refused on purpose" in answers[0].text
    for t, r in zip(good, answers[1:], strict=True):
        got = r.as_numpy("embedding") if isinstance(r, triton_grpc.InferResult) else _rest_answer_rows(r, t)
        assert np.array_equal(got, _text_rows(t))
    assert after["failures"] - before["failures"] == 2 and after["calls"] - before["calls"] == 3


def _token_ids(length: int, start: int) -> np.ndarray:
    return np.arange(start, start + length, dtype=np.int64).reshape(1, length)


def _rest_tokens(stack, ids: np.ndarray) -> httpx.Response:
    shape = list(ids.shape)
    body = {"id": f"rest-{shape[1]}", "outputs": [{"name": "embedding"}], "inputs": [
        {"name": "input_ids", "datatype": "INT64", "shape": shape, "data": ids.ravel().tolist()},
        {"name": "attention_mask", "datatype": "INT64", "shape": shape, "data": [1] * ids.size}]}
    return httpx.post(f"{stack.url}/v2/models/{TOKENS_MODEL}/infer", json=body, timeout=30,
                      headers={"authorization": f"Bearer {DEMO_KEY}"})


def _grpc_tokens(stack, ids: np.ndarray) -> triton_grpc.InferResult:
    inputs = [triton_grpc.InferInput("input_ids", list(ids.shape), "INT64"),
              triton_grpc.InferInput("attention_mask", list(ids.shape), "INT64")]
    inputs[0].set_data_from_numpy(ids)
    inputs[1].set_data_from_numpy(np.ones_like(ids))
    client = triton_grpc.InferenceServerClient(stack.url.removeprefix("http://"))
    try:
        return client.infer(TOKENS_MODEL, inputs, outputs=[triton_grpc.InferRequestedOutput("embedding")],
                            request_id=f"grpc-{ids.shape[1]}", headers={"authorization": f"Bearer {DEMO_KEY}"},
                            client_timeout=30)
    finally:
        client.close()


def _token_rows(ids: np.ndarray) -> np.ndarray:
    return np.array([demo_embedding(" ".join(str(int(i)) for i in row), 8) for row in ids], np.float32)


def test_token_ids_of_lengths_20_and_30_share_one_call_padded_to_32(stack) -> None:
    a, b = _token_ids(20, 1000), _token_ids(30, 5000)
    before = httpx.get(stack.kserve_stats, timeout=5).json()
    with ThreadPoolExecutor(2) as pool:
        rest, grpc_ = pool.submit(_rest_tokens, stack, a), pool.submit(_grpc_tokens, stack, b)
        r, g = rest.result(), grpc_.result()
    after = httpx.get(stack.kserve_stats, timeout=5).json()
    # One upstream call for both, its tensor padded to the bucket 32 (the demo records each call's length).
    assert after["calls"] - before["calls"] == 1 and after["seq_lens"][-1] == 32
    assert r.status_code == 200, r.text
    doc = r.json()
    assert doc["id"] == "rest-20" and doc["model_name"] == TOKENS_MODEL and doc["outputs"][0]["shape"] == [1, 8]
    assert np.array_equal(np.array(doc["outputs"][0]["data"], np.float32).reshape(1, 8), _token_rows(a))
    assert g.get_response().id == "grpc-30" and np.array_equal(g.as_numpy("embedding"), _token_rows(b))


def test_a_lone_token_id_call_goes_as_sent(stack) -> None:
    ids = _token_ids(20, 9000)
    r = _rest_tokens(stack, ids)  # alone for the whole window (min_size 2): no padding, no merge
    assert r.status_code == 200, r.text
    assert httpx.get(stack.kserve_stats, timeout=5).json()["seq_lens"][-1] == 20
    assert np.array_equal(np.array(r.json()["outputs"][0]["data"], np.float32).reshape(1, 8), _token_rows(ids))


def test_token_ids_with_a_lengths_input_share_one_call_padded_to_32(stack) -> None:
    # A REST caller's 20 ids, a gRPC caller's two rows of 30 (its second only 25 long, by its own seq_len).
    a, b = _token_ids(20, 2000), np.arange(7000, 7060, dtype=np.int64).reshape(2, 30)
    body = {"id": "rest-lengths", "outputs": [{"name": "embedding"}], "inputs": [
        {"name": "input_ids", "datatype": "INT64", "shape": [1, 20], "data": a.ravel().tolist()},
        {"name": "seq_len", "datatype": "INT64", "shape": [1], "data": [20]}]}

    def grpc_call() -> triton_grpc.InferResult:
        inputs = [triton_grpc.InferInput("input_ids", [2, 30], "INT64"), triton_grpc.InferInput("seq_len", [2], "INT64")]
        inputs[0].set_data_from_numpy(b)
        inputs[1].set_data_from_numpy(np.array([30, 25], np.int64))
        client = triton_grpc.InferenceServerClient(stack.url.removeprefix("http://"))
        try:
            return client.infer(LENGTHS_MODEL, inputs, outputs=[triton_grpc.InferRequestedOutput("embedding")],
                                headers={"authorization": f"Bearer {DEMO_KEY}"}, client_timeout=30)
        finally:
            client.close()

    before = httpx.get(stack.kserve_stats, timeout=5).json()
    with ThreadPoolExecutor(2) as pool:
        rest = pool.submit(httpx.post, f"{stack.url}/v2/models/{LENGTHS_MODEL}/infer", json=body, timeout=30,
                           headers={"authorization": f"Bearer {DEMO_KEY}"})
        g = pool.submit(grpc_call).result()
        r = rest.result()
    after = httpx.get(stack.kserve_stats, timeout=5).json()
    assert after["calls"] - before["calls"] == 1 and after["seq_lens"][-1] == 32
    assert r.status_code == 200, r.text
    # Exact only if each row's own length went with it: the demo would embed the padding's 0s otherwise.
    assert np.array_equal(np.array(r.json()["outputs"][0]["data"], np.float32).reshape(1, 8), _token_rows(a))
    assert np.array_equal(g.as_numpy("embedding"), np.concatenate([_token_rows(b[:1]), _token_rows(b[1:, :25])]))


def test_a_refused_grpc_input_to_a_kserve_rest_deployment_fails_only_its_caller(stack) -> None:
    good = [[f"good rest-bound grpc text {i}"] for i in range(2)]
    bad = [f"rest-bound grpc text {BAD_INPUT}"]
    with ThreadPoolExecutor(3) as pool:
        futures = [pool.submit(_grpc_text_or_error, stack, t, REST_TEXT_MODEL) for t in (good[0], bad, good[1])]
        answers = [f.result() for f in futures]
    assert isinstance(answers[1], InferenceServerException), answers[1]
    assert answers[1].status() == "StatusCode.INVALID_ARGUMENT" and "refused on purpose" in answers[1].message()
    for t, res in zip(good, (answers[0], answers[2]), strict=True):
        assert isinstance(res, triton_grpc.InferResult), res
        assert np.array_equal(res.as_numpy("embedding"), _text_rows(t))



def test_text_tensors_for_different_versions_do_not_merge(stack) -> None:
    body = {"inputs": [{"name": "text", "datatype": "BYTES", "shape": [1], "data": ["versioned text"]}]}
    paths = [f"/v2/models/{TEXT_MODEL}/versions/1/infer", f"/v2/models/{TEXT_MODEL}/infer"]
    before = httpx.get(stack.kserve_stats, timeout=5).json()["calls"]
    with ThreadPoolExecutor(2) as pool:
        answers = list(pool.map(lambda p: httpx.post(f"{stack.url}{p}", json=body, timeout=30,
                                                     headers={"authorization": f"Bearer {DEMO_KEY}"}), paths))
    assert [r.status_code for r in answers] == [200, 200], [r.text for r in answers]
    # Each went as sent, alone in its own batch: one call per version.
    assert httpx.get(stack.kserve_stats, timeout=5).json()["calls"] - before == 2


def _slot_metric(stack, name: str) -> float:
    text = httpx.get(f"http://{stack.cfg.extproc.metrics_address}/metrics", timeout=5).text
    return sum(float(ln.rsplit(" ", 1)[1]) for ln in text.splitlines()
               if ln.startswith(name + "{") and f'cluster="{ONE_SLOT}"' in ln)


def test_requests_the_batcher_declines_hold_a_slot(stack) -> None:
    """embed-one-slot batches (max_size 4) and has max_inflight 1: a 5-input request goes alone and holds
    the one slot while upstream, so the next such request waits for it in the queue; both are answered
    and the slot is free after."""
    def embed(texts: list[str]) -> httpx.Response:
        return httpx.post(f"{stack.url}/v1/embeddings", json={"model": ONE_SLOT_MODEL, "input": texts},
                          headers={"authorization": f"Bearer {DEMO_KEY}"}, timeout=30)

    first_texts = ["demo-hold-1000 one", "two", "three", "four", "five"]
    second_texts = [f"second {i}" for i in range(5)]
    with ThreadPoolExecutor(2) as pool:
        first = pool.submit(embed, first_texts)
        until(lambda: _slot_metric(stack, "modelyard_inflight") == 1)
        second = pool.submit(embed, second_texts)
        until(lambda: _slot_metric(stack, "modelyard_queue_depth") == 1)
        assert _slot_metric(stack, "modelyard_inflight") == 1  # still the first's
        one, two = first.result(), second.result()
    for r, texts in ((one, first_texts), (two, second_texts)):
        assert r.status_code == 200, r.text
        got = np.array([d["embedding"] for d in r.json()["data"]], np.float32)
        np.testing.assert_allclose(got, _expected(texts), rtol=1e-5)
    assert float(two.headers["x-modelyard-queue-wait-ms"]) > 0
    until(lambda: _slot_metric(stack, "modelyard_inflight") == 0)
