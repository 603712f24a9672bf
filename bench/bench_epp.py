"""Cost of the endpoint picker's work per request (`modelyard epp`, extproc/epp/) against the
replica pick alone (gateway mode's cost, `ReplicaBoard.pick`), in one process, same readings.

Cases, 8 fresh vLLM replicas and a chat body with a 4,000-character system prompt:
- `pick`: `ReplicaBoard.pick` with the prompt's text (hashing, score, sort): the baseline;
- `stream`: one `EppStream` through a unary request's five messages (request headers, the body,
  response headers, the response body): the body read (JSON, the chat parse, the prompt text), the
  pick, the replies built (header, `envoy.lb` metadata, the body streamed back), the in-flight
  count given back. gRPC's own cost per message is not in it (bench_session and the floor benches
  measure that).
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from envoy.service.ext_proc.v3 import external_processor_pb2 as pb  # noqa: E402

from bench.smoke import scaled  # noqa: E402
from contracts.config.endpoint_picker import EndpointPickerConfig  # noqa: E402
from extproc.epp.stream import EppStream  # noqa: E402
from extproc.replicas.board import ReplicaBoard  # noqa: E402
from extproc.replicas.prefix import prompt_text  # noqa: E402
from extproc.replicas.readings import ReplicaReading  # noqa: E402

NOW = 1000.0
EPS = [f"10.0.0.{i}:8000" for i in range(1, 9)]
CFG = EndpointPickerConfig(pool="bench", endpoints=EPS, replica_metrics={"kind": "vllm", "interval_ms": 50})
BODY = json.dumps({"model": "m", "messages": [{"role": "system", "content": ("You are a careful assistant. " * 140)[:4000]},
                                              {"role": "user", "content": "What is the capital of France?"}]}).encode()


def _board() -> ReplicaBoard:
    board = ReplicaBoard([], clock=lambda: NOW)
    board.reconfigure_sets({CFG.pool: (EPS, CFG.replica_metrics)})
    board.sets[CFG.pool].readings.update({ep: ReplicaReading(i % 4, 2, 0.1 * i, NOW) for i, ep in enumerate(EPS)})
    return board


def _messages() -> list[pb.ProcessingRequest]:
    head = pb.ProcessingRequest()
    for k, v in ((":method", "POST"), (":path", "/v1/chat/completions"), ("content-type", "application/json")):
        head.request_headers.headers.headers.add(key=k, raw_value=v.encode())
    body = pb.ProcessingRequest()
    body.request_body.body = BODY
    body.request_body.end_of_stream = True
    rhead = pb.ProcessingRequest()
    rhead.response_headers.headers.headers.add(key=":status", raw_value=b"200")
    rbody = pb.ProcessingRequest()
    rbody.response_body.body = b'{"choices": []}'
    rbody.response_body.end_of_stream = True
    return [head, body, rhead, rbody]


def _median_us(fn: Callable[[], object], reps: int, rounds: int = 5) -> float:
    """The median over rounds of each round's mean: per-call figures without timer overhead per call."""
    means = []
    for _ in range(rounds):
        t0 = time.perf_counter_ns()
        for _ in range(reps):
            fn()
        means.append((time.perf_counter_ns() - t0) / reps)
    return statistics.median(means) / 1000.0


def main() -> int:
    from adapters import openai

    board = _board()
    msgs = _messages()
    text = prompt_text(openai.parse_request(BODY))

    def pick() -> object:
        return board.pick(CFG.pool, prompt=text)

    def stream() -> object:
        s = EppStream(CFG, board)
        out = [r for m in msgs for r in s.handle(m)]
        s.close()
        assert len(out) == 4 and out[0].request_headers.response.header_mutation.set_headers
        return out

    reps = scaled(3000, 30)
    pick(), stream()
    p_us, s_us = _median_us(pick, reps), _median_us(stream, reps)
    print(f"{'case':<8} {'us/request':>11} {'x pick':>7}")
    print(f"{'pick':<8} {p_us:>11.1f} {1.0:>7.2f}")
    print(f"{'stream':<8} {s_us:>11.1f} {s_us / p_us:>7.2f}")
    rows = [{"bench": "epp", "case": "pick-8", "metric": "median", "value": round(p_us, 2), "unit": "us"},
            {"bench": "epp", "case": "stream-8", "metric": "median", "value": round(s_us, 2), "unit": "us",
             "baseline": round(p_us, 2), "ratio": round(s_us / p_us, 2)}]
    print("SUMMARY " + json.dumps(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
