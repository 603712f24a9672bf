"""Large answers off the event loop: the loop's longest stall while one large buffered answer is
translated, in the event loop (inline) against in a worker thread (offloaded, the default past
64 KiB: extproc/flows/offload.py), in the same run.

    .venv/bin/python bench/bench_offload.py

Cases, each through a `Session` (no Envoy, no sockets: the translation step alone):
- embeddings: an OpenAI client's 2048-input request for 1536 dimensions served by a Gemini
  deployment; its ~30 MB `batchEmbedContents` answer becomes OpenAI's base64 answer.
- chat: an OpenAI client served by a Gemini deployment; an 8 MB generateContent answer.
A ticker coroutine sleeping 1 ms records the longest gap between its wake-ups while the answer is
translated: what every other stream on that extproc waits at worst. Reports milliseconds (median of
the repeats); the offloaded row's `ratio` is offloaded / inline. The last stdout line is `SUMMARY [...]`.
"""

from __future__ import annotations

import asyncio
import base64
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import orjson
import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from envoy.service.ext_proc.v3 import external_processor_pb2 as pb  # noqa: E402

from adapters import embeddings  # noqa: E402
from adapters.embeddings import EmbeddingRequest, EmbeddingResponse  # noqa: E402
from bench.smoke import scaled  # noqa: E402
from contracts.config import parse_config  # noqa: E402
from extproc.flows import offload  # noqa: E402
from extproc.gateway import Gateway  # noqa: E402
from extproc.service import build_routes, loop_factory  # noqa: E402
from extproc.session import Session  # noqa: E402
from tests.core.session_driver import KEY, body_msg, headers_msg  # noqa: E402
from tests.stack_config import without_watermarks  # noqa: E402

ROUTES = build_routes()
INPUTS, DIMS = scaled((2048, 1536), (64, 1536))
CHAT_BYTES = scaled(8 * 1024 * 1024, 256 * 1024)
REPEATS = scaled(3, 1)
TICK_S = 0.001


def _gateway() -> Gateway:
    data = without_watermarks(yaml.safe_load((ROOT / "modelyard.yaml").read_text()))
    data.pop("ratelimit", None)  # the bench measures translation, not buckets
    return Gateway.build(parse_config(data))


def _embeddings_case() -> tuple[dict[str, str], bytes, bytes]:
    texts = [f"text number {i}" for i in range(INPUTS)]
    rng = np.random.default_rng(7)
    vecs = (rng.integers(-128, 128, (INPUTS, DIMS)) / 128).astype(np.float32)
    req = EmbeddingRequest("demo-embed-gemini", tuple(texts), "float", DIMS)
    answer = embeddings.render_response("gemini-batch", EmbeddingResponse("m", vecs, None), model="m", req=req)
    headers = {":method": "POST", ":path": "/v1/embeddings", "content-type": "application/json",
               "authorization": f"Bearer {KEY}"}
    body = orjson.dumps({"model": "demo-embed-gemini", "input": texts, "dimensions": DIMS,
                         "encoding_format": "base64"})
    return headers, body, answer


def _chat_case() -> tuple[dict[str, str], bytes, bytes]:
    text = ("The gateway translates this answer while other streams wait. " * (CHAT_BYTES // 60))[:CHAT_BYTES]
    answer = orjson.dumps({"candidates": [{"content": {"role": "model", "parts": [{"text": text}]},
                                           "finishReason": "STOP"}],
                           "usageMetadata": {"promptTokenCount": 3, "candidatesTokenCount": 100}})
    headers = {":method": "POST", ":path": "/v1/chat/completions", "content-type": "application/json",
               "authorization": f"Bearer {KEY}"}
    body = orjson.dumps({"model": "demo-gemini", "messages": [{"role": "user", "content": "hi"}]})
    return headers, body, answer


def _check(case: str, out: bytes) -> None:
    obj = orjson.loads(out)
    if case == "embeddings":
        ok = len(obj["data"]) == INPUTS and len(base64.b64decode(obj["data"][-1]["embedding"])) == DIMS * 4
    else:
        ok = len(obj["choices"][0]["message"]["content"]) == CHAT_BYTES
    if not ok:
        print(f"FAILED: {case}: the translated answer is wrong")
        sys.exit(1)


async def _translate(gw: Gateway, headers: dict[str, str], body: bytes, answer: bytes) -> tuple[float, float, bytes]:
    """(longest loop stall s, translation wall s, the client's body) for one answer's response step."""
    s = Session(gw, ROUTES)
    await s.handle(headers_msg(headers))
    r = await s.handle(body_msg(body))
    if not isinstance(r, pb.ProcessingResponse) or r.WhichOneof("response") != "request_body":
        print(f"FAILED: request not forwarded: {r}")
        sys.exit(1)
    await s.handle(headers_msg({":status": "200", "content-type": "application/json",
                                "content-length": str(len(answer))}, response=True))
    answer_msg = body_msg(answer, response=True)  # built before timing: it stands for gRPC's own decoding
    stop = False
    worst = 0.0

    async def ticker() -> None:
        nonlocal worst
        while not stop:
            t = time.perf_counter()
            await asyncio.sleep(TICK_S)
            worst = max(worst, time.perf_counter() - t - TICK_S)

    tick = asyncio.create_task(ticker())
    await asyncio.sleep(0.02)  # the ticker is running before the answer arrives
    worst = 0.0
    t0 = time.perf_counter()
    r = await s.handle(answer_msg)
    wall = time.perf_counter() - t0
    stop = True
    await tick
    s.close()
    if not isinstance(r, pb.ProcessingResponse):  # not an Interim (a step that waits): the answer is translated at once
        print(f"FAILED: no reply to the answer: {r!r}")
        sys.exit(1)
    return worst, wall, r.response_body.response.body_mutation.body


async def _run(gw: Gateway, case: str, inline: bool) -> tuple[float, float]:
    headers, body, answer = _embeddings_case() if case == "embeddings" else _chat_case()
    offload.INLINE_PARSE_BYTES = 1 << 62 if inline else DEFAULT_INLINE
    stalls, walls = [], []
    try:
        for _ in range(REPEATS):
            stall, wall, out = await _translate(gw, headers, body, answer)
            _check(case, out)
            stalls.append(stall)
            walls.append(wall)
    finally:
        offload.INLINE_PARSE_BYTES = DEFAULT_INLINE
    return statistics.median(stalls) * 1000, statistics.median(walls) * 1000


DEFAULT_INLINE = offload.INLINE_PARSE_BYTES


async def main_async() -> list[dict]:
    gw = _gateway()
    rows: list[dict] = []
    print(f"{'case':<40} {'mode':<10} {'max stall ms':>12} {'translate ms':>13}")
    for case, label in (("embeddings", f"embeddings_{INPUTS}x{DIMS}_gemini_to_openai"),
                        ("chat", f"chat_{CHAT_BYTES // 1024}KiB_gemini_to_openai")):
        inline_stall, inline_wall = await _run(gw, case, inline=True)
        off_stall, off_wall = await _run(gw, case, inline=False)
        for mode, stall, wall in (("inline", inline_stall, inline_wall), ("offloaded", off_stall, off_wall)):
            print(f"{label:<40} {mode:<10} {stall:>12.1f} {wall:>13.1f}")
        rows.append({"bench": "offload", "case": f"{label} inline", "metric": "loop_max_stall",
                     "value": round(inline_stall, 2), "unit": "ms"})
        rows.append({"bench": "offload", "case": f"{label} offloaded", "metric": "loop_max_stall",
                     "value": round(off_stall, 2), "unit": "ms", "baseline": round(inline_stall, 2),
                     "ratio": round(off_stall / inline_stall, 3) if inline_stall > 0 else 0.0})
        rows.append({"bench": "offload", "case": f"{label} offloaded", "metric": "translate_wall",
                     "value": round(off_wall, 2), "unit": "ms", "baseline": round(inline_wall, 2),
                     "ratio": round(off_wall / inline_wall, 3) if inline_wall > 0 else 0.0})
    return rows


def main() -> None:
    with asyncio.Runner(loop_factory=loop_factory("uvloop")) as runner:
        rows = runner.run(main_async())
    print("SUMMARY " + orjson.dumps(rows).decode())


if __name__ == "__main__":
    main()
