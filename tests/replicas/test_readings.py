"""The replica parsers on the model servers' own expositions (expositions/SOURCES.md says where
each comes from), and on the shapes they must refuse."""

from __future__ import annotations

from pathlib import Path

import pytest

from extproc.replicas.exposition import MetricsParseError
from extproc.replicas.readings import parse_replica_metrics

HERE = Path(__file__).parent / "expositions"


def _read(kind: str, name: str):
    return parse_replica_metrics(kind, (HERE / name).read_bytes(), 7.0)


def test_vllm_v1() -> None:
    r = _read("vllm", "vllm_v1.prom")
    assert (r.waiting, r.running, r.kv_usage, r.at) == (30, 10, 0.4, 7.0)
    assert r.loras == {"lora4", "lora3"}  # the newest lora_requests_info series
    assert r.max_lora == 1


def test_vllm_v0_scrape_older_cache_name_and_lora_off() -> None:
    """A V0 server's own scrape: `model_name` labels, histograms, `vllm:gpu_cache_usage_perc`."""
    r = _read("vllm", "vllm_v0.prom")
    assert (r.waiting, r.running, r.kv_usage) == (0, 0, 0.0)
    assert r.loras == frozenset() and r.max_lora == 0


def test_sglang() -> None:
    r = _read("sglang", "sglang.prom")
    assert (r.waiting, r.running, r.kv_usage) == (2826, 162, 0.28)
    assert r.max_lora is None


def test_tgi_router_scrape_with_histogram_and_summary() -> None:
    r = _read("tgi", "tgi.prom")
    assert (r.waiting, r.running, r.kv_usage, r.max_lora) == (0, 0, None, None)


def test_tgi_busy() -> None:
    body = (HERE / "tgi.prom").read_bytes().replace(b"tgi_queue_size 0", b"tgi_queue_size 12").replace(
        b"tgi_batch_current_size 0", b"tgi_batch_current_size 4")
    r = parse_replica_metrics("tgi", body, 0.0)
    assert (r.waiting, r.running) == (12, 4)


def test_triton_trtllm_scrape() -> None:
    """Triton with TensorRT-LLM: the nv_trt_llm_* families (other labels) are skipped unread."""
    r = _read("triton", "triton.prom")
    assert (r.waiting, r.running, r.kv_usage) == (0, 0, None)
    assert r.queue_us_total == 0


def test_triton_sums_models() -> None:
    body = (b'nv_inference_pending_request_count{model="tensorrt_llm",version="1"} 5\n'
            b'nv_inference_pending_request_count{model="preprocessing",version="1"} 1\n'
            b'nv_inference_queue_duration_us{model="tensorrt_llm",version="1"} 1520337\n'
            b'nv_inference_queue_duration_us{model="preprocessing",version="1"} 2100\n')
    r = parse_replica_metrics("triton", body, 0.0)
    assert (r.waiting, r.running) == (6, 0)
    assert r.queue_us_total == 1520337 + 2100


def test_several_engines_add_up_and_the_fullest_cache_counts() -> None:
    body = (b'vllm:num_requests_waiting{engine="0"} 1\nvllm:num_requests_waiting{engine="1"} 2\n'
            b'vllm:num_requests_running{engine="0"} 3\nvllm:kv_cache_usage_perc{engine="0"} 0.2\n'
            b'vllm:kv_cache_usage_perc{engine="1"} 0.7\n')
    r = parse_replica_metrics("vllm", body, 0.0)
    assert (r.waiting, r.running, r.kv_usage) == (3, 3, 0.7)


@pytest.mark.parametrize(("kind", "body"), [
    ("vllm", b"# nothing\n"),
    ("vllm", b'vllm:num_requests_waiting{engine="0"} 1\n'),  # running missing
    ("vllm", b"vllm:num_requests_waiting 1\nvllm:num_requests_running x\n"),
    ("vllm", b'vllm:num_requests_waiting{engine=0} 1\nvllm:num_requests_running 1\n'),
    ("sglang", (HERE / "tgi.prom").read_bytes()),
    ("tgi", b"<html>not metrics</html>\n"),
    ("triton", (HERE / "sglang.prom").read_bytes()),
])
def test_refused(kind: str, body: bytes) -> None:
    with pytest.raises(MetricsParseError):
        parse_replica_metrics(kind, body, 0.0)


def test_kv_out_of_range_is_clamped_and_nan_is_absent() -> None:
    body = b"vllm:num_requests_waiting 0\nvllm:num_requests_running 0\nvllm:kv_cache_usage_perc 1.5\n"
    assert parse_replica_metrics("vllm", body, 0.0).kv_usage == 1.0
    body = b"vllm:num_requests_waiting 0\nvllm:num_requests_running 0\nvllm:kv_cache_usage_perc NaN\n"
    assert parse_replica_metrics("vllm", body, 0.0).kv_usage is None
