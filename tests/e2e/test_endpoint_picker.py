"""Endpoint-picker mode through a real Envoy configured as the Gateway API Inference Extension
documents it (its e2e Envoy, kubernetes-sigs/gateway-api-inference-extension test/testdata/envoy.yaml:
ext_proc with request and response bodies FULL_DUPLEX_STREAMED, trailers SEND, and an
ORIGINAL_DST cluster reading `x-gateway-destination-endpoint`). Two demo replicas report vLLM's
metrics and say who answered (`x-demo-replica`); the client is the openai SDK. The subset hint
reaches the picker as the protocol says: `envoy.lb.subset_hint` filter metadata, written here by a
header-to-metadata rule (as a comma-separated string) and forwarded by ext_proc's metadata options.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterator

import openai
import pytest
import yaml

from tests.inference_gateway import Gateway, gateway_processes, inference_gateway_envoy
from tests.inference_gateway import chat as _chat
from tests.inference_gateway import client as _client
from tests.inference_gateway import fake as _fake
from tests.inference_gateway import settle as _settle
from tests.stack_config import free_port

SYSTEM = "You are the demo assistant of the endpoint-picker tests. " * 12  # several prompt blocks


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    work = tmp_path_factory.mktemp("epp")
    a_port, b_port, epp_port, listen, admin = (free_port() for _ in range(5))
    replicas = [f"127.0.0.1:{a_port}", f"127.0.0.1:{b_port}"]
    members = work / "endpoints"
    members.write_text("\n".join(replicas) + "\n")
    (work / "epp.yaml").write_text(yaml.safe_dump({
        "pool": "demo-pool", "address": f"127.0.0.1:{epp_port}", "endpoints_file": str(members),
        "replica_metrics": {"kind": "vllm", "interval_ms": 50, "stale_after_ms": 400},
        "shed_queue": 10, "objectives": {"batch-jobs": -1, "chat": 2}}))
    (work / "envoy.yaml").write_text(yaml.safe_dump(inference_gateway_envoy(listen, admin, epp_port, replicas)))
    demos = ["devstack.demo.openai_server", "--port", str(a_port), "--", "devstack.demo.openai_server",
             "--port", str(b_port)]
    with gateway_processes(work, demos, b_port, epp_port, listen):
        yield Gateway(f"http://127.0.0.1:{listen}", replicas)


def test_every_call_lands_on_the_replica_with_the_short_queue(gateway: Gateway) -> None:
    a, b = gateway.replicas
    client = _client(gateway)
    _fake(a, waiting=8, metrics=True)
    _fake(b, waiting=0, metrics=True)
    _settle(client, b)
    assert Counter(_chat(client, [{"role": "user", "content": f"q{i}"}]) for i in range(20)) == {b: 20}
    _fake(a, waiting=0)
    _fake(b, waiting=8)
    _settle(client, a)
    assert Counter(_chat(client, [{"role": "user", "content": f"r{i}"}]) for i in range(20)) == {a: 20}
    # The `envoy.lb` dynamic metadata names the same endpoint (a round robin would give b half).
    by_metadata = _client(gateway, **{"x-test-lb": "metadata"})
    assert Counter(_chat(by_metadata, [{"role": "user", "content": f"m{i}"}]) for i in range(10)) == {a: 10}
    # A stream passes through the full-duplex response path chunk by chunk.
    stream = client.chat.completions.create(model="demo", messages=[{"role": "user", "content": "stream"}],
                                            stream=True)
    assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    _fake(b, waiting=0)


def test_the_subset_hint_is_honoured(gateway: Gateway) -> None:
    a, b = gateway.replicas
    _fake(a, waiting=0, metrics=True)
    _fake(b, waiting=8, metrics=True)
    _settle(_client(gateway), a)
    # The hint names only b, the longer queue: every call goes there all the same.
    hinted = _client(gateway, **{"x-test-subset": b})
    assert Counter(_chat(hinted, [{"role": "user", "content": f"h{i}"}]) for i in range(10)) == {b: 10}
    # A hint naming no member of the pool: 503, in the OpenAI error shape.
    with pytest.raises(openai.InternalServerError) as e:
        _chat(_client(gateway, **{"x-test-subset": "10.9.9.9:8000"}), [{"role": "user", "content": "x"}])
    assert e.value.status_code == 503 and "no ready endpoint" in e.value.message
    _fake(b, waiting=0)


def test_prefix_affinity_holds_a_conversation(gateway: Gateway) -> None:
    a, b = gateway.replicas
    client = _client(gateway)
    _fake(a, waiting=0, metrics=True)
    _fake(b, waiting=2, metrics=True)
    _settle(client, a)
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "hello"}]
    assert _chat(client, messages) == a
    _fake(a, waiting=2)
    _fake(b, waiting=0)
    _settle(client, b)
    for turn in range(4):
        messages += [{"role": "assistant", "content": f"answer {turn}"},
                     {"role": "user", "content": f"and then {turn}?"}]
        assert _chat(client, messages) == a, turn
    assert _chat(client, [{"role": "system", "content": "Another conversation. " * 20},
                          {"role": "user", "content": "hi"}]) == b
    _fake(a, waiting=0)


def test_saturated_pool_sheds_sheddable_requests_only(gateway: Gateway) -> None:
    a, b = gateway.replicas
    _fake(a, waiting=30, metrics=True)
    _fake(b, waiting=20, metrics=True)
    batch = _client(gateway, **{"x-gateway-inference-objective": "batch-jobs"})
    deadline = time.monotonic() + 10
    while True:  # served until both new readings have arrived (one poll each), then shed
        try:
            _chat(batch, [{"role": "user", "content": "x"}])
        except openai.RateLimitError as e:
            assert e.status_code == 429 and "sheddable" in e.message
            assert e.response.headers["retry-after"] == "1"
            break
        assert time.monotonic() < deadline, "never shed"
    with pytest.raises(openai.RateLimitError):  # and stays shed while the pool is saturated
        _chat(batch, [{"role": "user", "content": "x"}])
    # Priority 0 (no objective) and above: still served, by the least loaded.
    assert _chat(_client(gateway, **{"x-gateway-inference-objective": "chat"}), [{"role": "user", "content": "y"}]) == b
    _fake(a, waiting=0)
    _fake(b, waiting=0)


def test_no_ready_replica_gives_503(gateway: Gateway) -> None:
    a, b = gateway.replicas
    client = _client(gateway)
    _fake(a, waiting=0, metrics=False)  # /metrics answers 503: its reading goes stale, it is not ready
    _fake(b, waiting=5, metrics=True)
    _settle(client, b)
    _fake(b, metrics=False)
    deadline = time.monotonic() + 10
    while True:
        try:
            _chat(client, [{"role": "user", "content": "anyone?"}])
        except openai.InternalServerError as e:
            assert e.status_code == 503 and "no ready endpoint in InferencePool demo-pool" in e.message
            assert e.response.headers["retry-after"] == "1"
            break
        assert time.monotonic() < deadline, "never 503"
    _fake(a, metrics=True)
    _fake(b, waiting=0, metrics=True)
    _settle(client, a)


def test_modelyard_up_puts_the_picker_and_its_listener_in_front_of_the_pool(
        tmp_path_factory: pytest.TempPathFactory) -> None:
    """The embedded default: `endpoint_picker.listener` makes the stack start `modelyard epp` and
    render Envoy's listener for the pool (controlplane/inference_pool.py), over the config's own
    demo replicas; the pool's calls need no gateway key (the gateway's own listener still does)."""
    from tests.stack_config import small_config, start_stack

    data = small_config()
    eps = [f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"]
    data["models"].append({"name": "pooled", "task_types": ["chat"], "deployments": [{
        "cluster": "demo-pooled", "protocol": "openai", "endpoints": eps}]})
    listener = f"127.0.0.1:{free_port()}"
    data["endpoint_picker"] = {"pool": "demo-pool", "address": f"127.0.0.1:{free_port()}", "listener": listener,
                               "endpoints": eps, "replica_metrics": {"kind": "vllm", "interval_ms": 50}}
    with start_stack(tmp_path_factory.mktemp("epp-up"), data, shared_demos=True) as stack:
        assert stack.child("epp").is_ready()
        pool = Gateway(f"http://{listener}", eps)
        _fake(eps[0], waiting=6)
        client = _client(pool)
        _settle(client, eps[1])
        assert Counter(_chat(client, [{"role": "user", "content": f"u{i}"}]) for i in range(10)) == {eps[1]: 10}
