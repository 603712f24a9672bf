"""The model servers' own load, one `ReplicaReading` per replica, from their Prometheus text.

vLLM, SGLang, TGI and Triton name the same few facts differently; a reading holds what routing
needs of them: requests waiting and running, KV-cache use (0..1) and the LoRA adapters loaded.
Pure: bytes in, a reading out (`MetricsParseError` on text that is not what the kind reports).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from extproc.replicas.exposition import MetricsParseError, samples


@dataclass(frozen=True, slots=True)
class ReplicaReading:
    waiting: float
    running: float
    kv_usage: float | None  # 0..1; None: the server does not report it (TGI, Triton)
    at: float  # monotonic time it arrived
    loras: frozenset[str] = frozenset()  # adapters loaded (running) now
    max_lora: int | None = None  # adapter slots; None: the server reports no LoRA state
    queue_us_total: float | None = None  # Triton: cumulative queue time (a counter), for rates

    @property
    def queue(self) -> float:
        return self.waiting + self.running


def _clamp01(x: float) -> float:
    return min(1.0, max(0.0, x))



_FRACTIONS = frozenset({"vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc", "sglang:token_usage"})


def _collect(body: bytes, names: frozenset[str]) -> tuple[dict[str, float], list[dict[str, str]]]:
    """Counts are summed over every series (several engines or models behind one port add up),
    usage fractions take the fullest; `lora_requests_info` series are kept whole."""
    found: dict[str, float] = {}
    lora: list[tuple[float, dict[str, str]]] = []
    for name, labels, value in samples(body, names):
        if name == "vllm:lora_requests_info":
            lora.append((value, labels))
        else:
            value = max(0.0, value)
            if name in _FRACTIONS:
                found[name] = max(found.get(name, 0.0), value)
            else:
                found[name] = found.get(name, 0.0) + value
    lora.sort(key=lambda vl: vl[0])  # its value is the time of the change: the newest last
    return found, [labels for _, labels in lora]


_VLLM = frozenset({"vllm:num_requests_waiting", "vllm:num_requests_running", "vllm:kv_cache_usage_perc",
                   "vllm:gpu_cache_usage_perc", "vllm:lora_requests_info"})


def parse_vllm(body: bytes, now: float) -> ReplicaReading:
    found, lora = _collect(body, _VLLM)
    waiting, running = found.get("vllm:num_requests_waiting"), found.get("vllm:num_requests_running")
    if waiting is None or running is None:
        raise MetricsParseError("vllm metrics: no vllm:num_requests_waiting / vllm:num_requests_running")
    kv = found.get("vllm:kv_cache_usage_perc", found.get("vllm:gpu_cache_usage_perc"))  # renamed in V1
    loras: frozenset[str] = frozenset()
    max_lora = None
    if lora:
        newest = lora[-1]
        loras = frozenset(a for a in newest.get("running_lora_adapters", "").split(",") if a)
        try:
            max_lora = int(newest.get("max_lora", "0"))
        except ValueError:
            raise MetricsParseError(f"vllm metrics: max_lora {newest.get('max_lora')!r}") from None
    return ReplicaReading(waiting, running, None if kv is None else _clamp01(kv), now, loras, max_lora)


_SGLANG = frozenset({"sglang:num_queue_reqs", "sglang:num_running_reqs", "sglang:token_usage"})


def parse_sglang(body: bytes, now: float) -> ReplicaReading:
    found, _ = _collect(body, _SGLANG)
    waiting, running = found.get("sglang:num_queue_reqs"), found.get("sglang:num_running_reqs")
    if waiting is None or running is None:
        raise MetricsParseError("sglang metrics: no sglang:num_queue_reqs / sglang:num_running_reqs")
    kv = found.get("sglang:token_usage")
    return ReplicaReading(waiting, running, None if kv is None else _clamp01(kv), now)


_TGI = frozenset({"tgi_queue_size", "tgi_batch_current_size"})


def parse_tgi(body: bytes, now: float) -> ReplicaReading:
    found, _ = _collect(body, _TGI)
    waiting = found.get("tgi_queue_size")
    if waiting is None:
        raise MetricsParseError("tgi metrics: no tgi_queue_size")
    return ReplicaReading(waiting, found.get("tgi_batch_current_size", 0.0), None, now)


_TRITON = frozenset({"nv_inference_pending_request_count", "nv_inference_queue_duration_us"})


def parse_triton(body: bytes, now: float) -> ReplicaReading:
    """Triton reports what waits (pending, every model summed), not what runs."""
    found, _ = _collect(body, _TRITON)
    pending = found.get("nv_inference_pending_request_count")
    if pending is None:
        raise MetricsParseError("triton metrics: no nv_inference_pending_request_count")
    return ReplicaReading(pending, 0.0, None, now, queue_us_total=found.get("nv_inference_queue_duration_us"))


PARSERS: dict[str, Callable[[bytes, float], ReplicaReading]] = {
    "vllm": parse_vllm, "sglang": parse_sglang, "tgi": parse_tgi, "triton": parse_triton}


def parse_replica_metrics(kind: str, body: bytes, now: float) -> ReplicaReading:
    return PARSERS[kind](body, now)
