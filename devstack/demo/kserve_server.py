"""A demo KServe v2 gRPC model server: the stand-in for a Triton/KServe box with a GPU.

`ModelInfer` takes one NCHW image tensor (FP32 or FP16, raw or typed contents), undoes the
normalisation it was configured with (defaults = `TensorInput` defaults) to recover RGB, and
labels each image by its dominant colour: every pixel votes for the nearest palette colour and
the `scores` output [N, len(labels)] FP32 holds the vote shares (they sum to 1). A red square
comes back top-1 `red`. A simulated device cost (fixed_ms per call + per_image_ms per image,
one call at a time like one GPU), `GET /stats` ({"calls", "images", "failures"}) and
`POST /control` ({"fail_next", "fixed_ms", "per_image_ms"}, for tests) serve the batching benchmark.
A BYTES input is a text model's instead: one text per row in, `embedding` [N, 8] FP32 out (the demo
embedding of each text); a text holding `demo-bad-400` is refused (INVALID_ARGUMENT). INT64/INT32
`input_ids` [N, L] (with an optional `attention_mask` [N, L] and/or `seq_len` [N]) are token ids:
`embedding` [N, 8], each row the demo embedding of its ids where the mask is 1 and within its length
(so right padding under a 0 mask or past `seq_len` changes nothing); `/stats` `seq_lens` lists the L of every such call
(`versions`: the model version each image call asked for). The stats port also speaks KServe v2
REST (JSON: `POST /v2/models/{m}/infer`, readiness, `GET /v2`) for the same models, a REST upstream;
`--rest` serves that on `--port` (the gRPC server then takes any free port).

    python -m devstack.demo.kserve_server --port 8201 --stats-port 8202 --fixed-ms 5 --per-image-ms 1
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import math
import random
import signal
import struct
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import grpc
import numpy as np
import orjson
from aiohttp import web
from grpc_health.v1 import health, health_pb2_grpc
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc as pb_grpc

from adapters import kserve
from contracts.errors import ModelyardError
from devstack.demo.behaviour import demo_embedding
from devstack.demo.faults import BAD_INPUT

log = logging.getLogger("modelyard.demo.kserve")

DEFAULT_LABELS = ["red", "green", "blue", "white", "black", "yellow", "cyan", "magenta"]
PALETTE: dict[str, tuple[int, int, int]] = {
    "red": (255, 0, 0), "green": (0, 255, 0), "blue": (0, 0, 255), "white": (255, 255, 255),
    "black": (0, 0, 0), "yellow": (255, 255, 0), "cyan": (0, 255, 255), "magenta": (255, 0, 255),
    "gray": (128, 128, 128), "orange": (255, 165, 0),
}
_DTYPES: dict[str, np.dtype] = {"FP32": np.dtype("<f4"), "FP16": np.dtype("<f2")}
TEXT_OUTPUT, TEXT_DIMS = "embedding", 8  # the text model's output
TOKEN_INPUT, MASK_INPUT = "input_ids", "attention_mask"  # the text model's token-id inputs
LENGTHS_INPUT = "seq_len"  # or each row's length, [N] (or [N, 1])


class TensorError(ValueError):
    """The request tensor is unusable (INVALID_ARGUMENT)."""


@dataclass
class ColourModel:
    """The demo model: normalisation to undo plus the labels to score."""

    labels: list[str] = field(default_factory=lambda: list(DEFAULT_LABELS))
    mean: tuple[float, float, float] = (0.485, 0.456, 0.406)
    std: tuple[float, float, float] = (0.229, 0.224, 0.225)
    scale: float = 1.0 / 255.0
    channel_order: str = "RGB"

    def to_rgb(self, x: np.ndarray) -> np.ndarray:
        """NCHW normalised tensor -> N x (H*W) x 3 RGB in 0..255 (mean/std index R, G, B)."""
        x = x.astype(np.float32)
        if self.channel_order == "BGR":
            x = x[:, ::-1]
        mean = np.array(self.mean, np.float32)[None, :, None, None]
        std = np.array(self.std, np.float32)[None, :, None, None]
        rgb = (x * std + mean) / self.scale
        return rgb.reshape(rgb.shape[0], 3, -1).transpose(0, 2, 1)

    def scores(self, x: np.ndarray) -> np.ndarray:
        """[N, len(labels)] vote shares; labels with no palette colour never win a vote."""
        known = [(j, PALETTE[name.lower()]) for j, name in enumerate(self.labels) if name.lower() in PALETTE]
        out = np.zeros((x.shape[0], len(self.labels)), dtype=np.float32)
        if not known or x.shape[0] == 0:
            return out
        rgb = self.to_rgb(x)
        colours = np.array([c for _, c in known], np.float32)
        d = ((rgb[:, :, None, :] - colours[None, None, :, :]) ** 2).sum(-1)
        votes = d.argmin(-1)
        pixels = max(votes.shape[1], 1)
        for k, (j, _) in enumerate(known):
            out[:, j] = (votes == k).sum(1) / pixels
        return out


def read_input(req: pb.ModelInferRequest) -> np.ndarray:
    """The request's single NCHW FP32/FP16 tensor, from raw or typed contents."""
    if len(req.inputs) != 1:
        raise TensorError(f"expected exactly one input tensor, got {len(req.inputs)}")
    t = req.inputs[0]
    if t.datatype not in _DTYPES:
        raise TensorError(f"input {t.name!r}: datatype {t.datatype} not supported (FP32 or FP16)")
    shape = list(t.shape)
    if len(shape) != 4 or shape[1] != 3 or any(d < 1 for d in shape):
        raise TensorError(f"input {t.name!r}: shape {shape} is not [N, 3, H, W]")
    count = math.prod(shape)
    if req.raw_input_contents:
        raw = req.raw_input_contents[0]
        dt = _DTYPES[t.datatype]
        if len(raw) != count * dt.itemsize:
            raise TensorError(f"input {t.name!r}: {len(raw)} raw bytes do not fit {shape} {t.datatype}")
        return np.frombuffer(raw, dtype=dt).reshape(shape)
    if t.datatype != "FP32":
        raise TensorError(f"input {t.name!r}: FP16 needs raw_input_contents")
    vals = t.contents.fp32_contents
    if len(vals) != count:
        raise TensorError(f"input {t.name!r}: {len(vals)} values do not fit {shape}")
    return np.array(vals, dtype=np.float32).reshape(shape)


@dataclass
class Stats:
    calls: int = 0
    images: int = 0
    failures: int = 0
    seq_lens: list[int] = field(default_factory=list)  # token-id calls: the sequence length each came with
    versions: list[str] = field(default_factory=list)  # image calls: the model version each asked for ("" none)


class KServeDemoServicer(pb_grpc.GRPCInferenceServiceServicer):
    def __init__(
        self, models: Sequence[str] = ("demo-colors", "demo-text"), model: ColourModel | None = None,
        fixed_ms: float = 0.0, per_image_ms: float = 0.0, fail_rate: float = 0.0, fail_next: int = 0,
        max_concurrency: int = 1, output: str = "scores", seed: int | None = None,
    ) -> None:
        self.models = set(models)
        self.model = model or ColourModel()
        self.fixed_ms, self.per_image_ms = fixed_ms, per_image_ms
        self.fail_rate, self.fail_next = fail_rate, fail_next
        self.output = output
        self.stats = Stats()
        self._slots = asyncio.Semaphore(max(1, max_concurrency))  # 1 = one GPU, one batch at a time
        self._rng = random.Random(seed)

    async def _known(self, name: str, context: grpc.aio.ServicerContext) -> None:
        if name not in self.models:
            await context.abort(grpc.StatusCode.NOT_FOUND, f"model {name!r} is not served here")

    async def ServerLive(self, request: Any, context: Any) -> pb.ServerLiveResponse:
        return pb.ServerLiveResponse(live=True)

    async def ServerReady(self, request: Any, context: Any) -> pb.ServerReadyResponse:
        return pb.ServerReadyResponse(ready=True)

    async def ModelReady(self, request: pb.ModelReadyRequest, context: Any) -> pb.ModelReadyResponse:
        return pb.ModelReadyResponse(ready=request.name in self.models)

    async def ServerMetadata(self, request: Any, context: Any) -> pb.ServerMetadataResponse:
        return pb.ServerMetadataResponse(name="modelyard-demo-kserve", version="1", extensions=[])

    async def ModelMetadata(self, request: pb.ModelMetadataRequest, context: Any) -> pb.ModelMetadataResponse:
        await self._known(request.name, context)
        r = pb.ModelMetadataResponse(name=request.name, versions=["1"], platform="modelyard-demo")
        r.inputs.add(name="input", datatype="FP32", shape=[-1, 3, -1, -1])
        r.outputs.add(name=self.output, datatype="FP32", shape=[-1, len(self.model.labels)])
        return r

    async def ModelInfer(self, request: pb.ModelInferRequest, context: Any) -> pb.ModelInferResponse:
        await self._known(request.model_name, context)
        forced = request.parameters.get("demo_fail_code")
        if forced is not None and forced.int64_param:
            self.stats.failures += 1
            await context.abort(grpc.StatusCode(_code(forced.int64_param)), "demo: forced failure")
        if self.fail_next > 0 or (self.fail_rate and self._rng.random() < self.fail_rate):
            self.fail_next = max(0, self.fail_next - 1)
            self.stats.failures += 1
            await context.abort(grpc.StatusCode.UNAVAILABLE, "demo: simulated upstream failure")
        if len(request.inputs) == 1 and request.inputs[0].datatype == "BYTES":
            return await self._embed_texts(request, context)
        if any(t.name == TOKEN_INPUT for t in request.inputs):
            return await self._embed_tokens(request, context)
        for o in request.outputs:
            if o.name != self.output:
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"unknown output {o.name!r}")
        try:
            x = read_input(request)
        except TensorError as e:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(e))
        n = x.shape[0]
        async with self._slots:
            self.stats.calls += 1
            self.stats.images += n
            self.stats.versions.append(request.model_version)
            delay = (self.fixed_ms + self.per_image_ms * n) / 1000.0
            if delay > 0:
                await asyncio.sleep(delay)
            scores = await asyncio.to_thread(self.model.scores, x)
        resp = pb.ModelInferResponse(model_name=request.model_name, model_version="1", id=request.id)
        resp.outputs.add(name=self.output, datatype="FP32", shape=[n, len(self.model.labels)])
        resp.raw_output_contents.append(scores.astype("<f4").tobytes())
        return resp


    async def _embed_texts(self, request: pb.ModelInferRequest, context: Any) -> pb.ModelInferResponse:
        """A text model: BYTES [N] (or [N, 1]) -> `embedding` FP32 [N, TEXT_DIMS], each row
        `behaviour.demo_embedding(text)`, so a caller can check its own rows exactly."""
        t = request.inputs[0]
        shape = list(t.shape)
        try:
            texts = read_texts(request)
        except TensorError as e:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(e))
        if any(BAD_INPUT in x for x in texts):
            self.stats.failures += 1
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "demo: an input was refused on purpose")
        for o in request.outputs:
            if o.name != TEXT_OUTPUT:
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"unknown output {o.name!r}")
        n = shape[0]
        async with self._slots:
            self.stats.calls += 1
            self.stats.images += n
            delay = (self.fixed_ms + self.per_image_ms * n) / 1000.0
            if delay > 0:
                await asyncio.sleep(delay)
            rows = np.array([demo_embedding(x, TEXT_DIMS) for x in texts], np.float32)
        resp = pb.ModelInferResponse(model_name=request.model_name, model_version="1", id=request.id)
        resp.outputs.add(name=TEXT_OUTPUT, datatype="FP32", shape=[n, TEXT_DIMS])
        resp.raw_output_contents.append(rows.astype("<f4").tobytes())
        return resp


    async def _embed_tokens(self, request: pb.ModelInferRequest, context: Any) -> pb.ModelInferResponse:
        """Token ids `[N, L]` (+ `attention_mask`) -> `embedding` [N, TEXT_DIMS]: each row the demo
        embedding of the row's ids under a 1 in the mask, a per-sequence output padding cannot change."""
        try:
            ids, mask = read_tokens(request)
        except TensorError as e:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(e))
        for o in request.outputs:
            if o.name != TEXT_OUTPUT:
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"unknown output {o.name!r}")
        n = ids.shape[0]
        async with self._slots:
            self.stats.calls += 1
            self.stats.images += n
            self.stats.seq_lens.append(int(ids.shape[1]))
            delay = (self.fixed_ms + self.per_image_ms * n) / 1000.0
            if delay > 0:
                await asyncio.sleep(delay)
            rows = np.array([demo_embedding(token_text(r, m), TEXT_DIMS) for r, m in zip(ids, mask, strict=True)],
                            np.float32)
        resp = pb.ModelInferResponse(model_name=request.model_name, model_version="1", id=request.id)
        resp.outputs.add(name=TEXT_OUTPUT, datatype="FP32", shape=[n, TEXT_DIMS])
        resp.raw_output_contents.append(rows.astype("<f4").tobytes())
        return resp


def token_text(ids: np.ndarray, mask: np.ndarray) -> str:
    """The text the demo embeds for one row of token ids: its ids under the mask, space-separated."""
    return " ".join(str(int(i)) for i, m in zip(ids, mask, strict=True) if m)


def read_tokens(req: pb.ModelInferRequest) -> tuple[np.ndarray, np.ndarray]:
    """`input_ids` [N, L] and the mask (`attention_mask`, ones when absent, zero past `seq_len` where
    given), raw contents, INT64 or INT32."""
    out: dict[str, np.ndarray] = {}
    if len(req.raw_input_contents) != len(req.inputs):
        raise TensorError("token ids must come as raw contents")
    for t, raw in zip(req.inputs, req.raw_input_contents, strict=True):
        shape = list(t.shape)
        if t.name == LENGTHS_INPUT and t.datatype in ("INT64", "INT32") and 1 <= len(shape) <= 2:
            shape = [math.prod(shape)]  # [N] or [N, 1]
        elif t.name not in (TOKEN_INPUT, MASK_INPUT) or t.datatype not in ("INT64", "INT32") or len(shape) != 2:
            raise TensorError(f"input {t.name!r}: want input_ids / attention_mask INT64 [N, L], seq_len [N]")
        dtype = np.dtype("<i8" if t.datatype == "INT64" else "<i4")
        if len(raw) != math.prod(shape) * dtype.itemsize:
            raise TensorError(f"input {t.name!r}: raw contents do not hold {shape}")
        out[t.name] = np.frombuffer(raw, dtype=dtype).reshape(shape)
    ids = out[TOKEN_INPUT]
    mask = out.get(MASK_INPUT, np.ones_like(ids))
    if mask.shape != ids.shape:
        raise TensorError("attention_mask must have input_ids' shape")
    if LENGTHS_INPUT in out:
        lengths = out[LENGTHS_INPUT]
        if lengths.shape != (ids.shape[0],) or (lengths < 0).any() or (lengths > ids.shape[1]).any():
            raise TensorError("seq_len must hold one length per row, each within the row")
        mask = mask * (np.arange(ids.shape[1]) < lengths[:, None])
    return ids, mask


def read_texts(req: pb.ModelInferRequest) -> list[str]:
    """The request's BYTES input, one text per row ([N] or [N, 1]), from raw or typed contents."""
    t = req.inputs[0]
    shape = list(t.shape)
    if not 1 <= len(shape) <= 2 or shape[0] < 1 or math.prod(shape[1:]) != 1:
        raise TensorError(f"input {t.name!r}: shape {shape} is not [N] or [N, 1] texts")
    if not req.raw_input_contents:
        return [b.decode("utf-8", "replace") for b in t.contents.bytes_contents][: shape[0]]
    raw, out, pos = req.raw_input_contents[0], [], 0
    while pos + 4 <= len(raw):
        (size,) = struct.unpack_from("<I", raw, pos)
        out.append(raw[pos + 4:pos + 4 + size].decode("utf-8", "replace"))
        pos += 4 + size
    if pos != len(raw) or len(out) != shape[0]:
        raise TensorError(f"input {t.name!r}: raw contents do not hold {shape[0]} texts")
    return out


class _Refused(Exception):
    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        super().__init__(details)
        self.code, self.details = code, details


class _RestContext:
    """What the servicer's `ModelInfer` needs of a gRPC context, for a REST call: abort raises."""

    async def abort(self, code: grpc.StatusCode, details: str) -> None:
        raise _Refused(code, details)


def rest_routes(app: web.Application, servicer: KServeDemoServicer) -> None:
    """KServe v2 REST (JSON) in front of the same servicer: the demo as a REST upstream."""

    def _json(doc: Any, status: int = 200) -> web.Response:
        return web.Response(status=status, body=orjson.dumps(doc), content_type="application/json")

    async def ready(_: web.Request) -> web.Response:
        return _json({"ready": True})

    async def server(_: web.Request) -> web.Response:
        return _json({"name": "modelyard-demo-kserve", "version": "1", "extensions": []})

    async def model_ready(request: web.Request) -> web.Response:
        known = request.match_info["name"] in servicer.models
        return _json({"ready": known}, 200 if known else 404)

    async def infer(request: web.Request) -> web.Response:
        name = request.match_info["name"]
        try:
            req = kserve.parse_request(await request.read(), name).request
            resp = await servicer.ModelInfer(req, _RestContext())
        except ModelyardError as e:
            return _json({"error": e.message}, 400)
        except _Refused as e:
            return _json({"error": e.details}, kserve.grpc_status_to_http(e.code.value[0]))
        return web.Response(body=kserve.render_infer_reply(resp)[0], content_type="application/json")

    app.router.add_get("/health", ready)
    app.router.add_get("/v2", server)
    app.router.add_get("/v2/health/ready", ready)
    app.router.add_get("/v2/health/live", ready)
    app.router.add_get("/v2/models/{name}/ready", model_ready)
    app.router.add_post("/v2/models/{name}/infer", infer)


def _code(value: int) -> tuple[int, str]:
    for c in grpc.StatusCode:
        if c.value[0] == value:
            return c.value
    return grpc.StatusCode.UNKNOWN.value


@dataclass
class RunningServer:
    """Handle to a started demo server: its ports, live stats, and `stop()`."""

    port: int
    stats_port: int | None
    servicer: KServeDemoServicer
    _server: grpc.aio.Server
    _runner: web.AppRunner | None

    @property
    def stats(self) -> Stats:
        return self.servicer.stats

    async def wait(self) -> None:
        await self._server.wait_for_termination()

    async def stop(self, grace: float = 0.5) -> None:
        await self._server.stop(grace)
        if self._runner is not None:
            await self._runner.cleanup()


async def start(
    port: int = 0, *, host: str = "127.0.0.1", stats_port: int | None = None, **kwargs: Any
) -> RunningServer:
    """Start the gRPC server (and /stats if stats_port is given; 0 picks a free port)."""
    servicer = KServeDemoServicer(**kwargs)
    server = grpc.aio.server(options=[("grpc.so_reuseport", 0), ("grpc.max_receive_message_length", 256 * 1024 * 1024),
                                      ("grpc.max_send_message_length", 256 * 1024 * 1024)])
    pb_grpc.add_GRPCInferenceServiceServicer_to_server(servicer, server)
    # Standard gRPC health (server-wide status SERVING): what Envoy's grpc health check asks.
    health_pb2_grpc.add_HealthServicer_to_server(health.aio.HealthServicer(), server)
    bound = server.add_insecure_port(f"{host}:{port}")
    if bound == 0:
        raise OSError(f"cannot bind {host}:{port}")
    await server.start()
    runner, bound_stats = None, None
    if stats_port is not None:
        async def stats(_: web.Request) -> web.Response:
            s = servicer.stats
            body = {"calls": s.calls, "images": s.images, "failures": s.failures, "seq_lens": s.seq_lens[-100:],
                    "versions": s.versions[-100:]}
            return web.Response(body=orjson.dumps(body), content_type="application/json")

        async def control(request: web.Request) -> web.Response:
            # Tests and benchmarks steer the next calls: {"fail_next": N, "fixed_ms": F, "per_image_ms": P}.
            try:
                doc = orjson.loads(await request.read())
                for name in ("fail_next", "fixed_ms", "per_image_ms"):
                    if name in doc:
                        setattr(servicer, name, type(getattr(servicer, name))(doc[name]))
            except (orjson.JSONDecodeError, TypeError, ValueError, AttributeError):
                return web.Response(status=400, text="expected a JSON object of fail_next/fixed_ms/per_image_ms")
            return await stats(request)

        app = web.Application()
        app.router.add_get("/stats", stats)
        app.router.add_post("/control", control)
        rest_routes(app, servicer)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, host, stats_port)
        await site.start()
        bound_stats = runner.addresses[0][1]
    log.info("demo kserve on %s:%d (stats %s)", host, bound, bound_stats)
    return RunningServer(bound, bound_stats, servicer, server, runner)


async def serve(port: int, **kwargs: Any) -> None:
    """Run until cancelled or SIGTERM/SIGINT (then stop gracefully)."""
    running = await start(port, **kwargs)
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(NotImplementedError, RuntimeError):  # not the main thread / no signals here
            loop.add_signal_handler(sig, stop.set)
    try:
        await stop.wait()
    finally:
        await running.stop()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="demo KServe v2 gRPC model server (dominant-colour classifier)")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8201)
    p.add_argument("--stats-port", type=int, default=None, help="serve GET /stats (and KServe v2 REST) here")
    p.add_argument("--rest", action="store_true", help="serve KServe v2 REST (and /stats) on --port instead")
    p.add_argument("--models", nargs="+", default=["demo-colors", "demo-text"])
    p.add_argument("--labels", nargs="+", default=DEFAULT_LABELS)
    p.add_argument("--mean", nargs=3, type=float, default=[0.485, 0.456, 0.406])
    p.add_argument("--std", nargs=3, type=float, default=[0.229, 0.224, 0.225])
    p.add_argument("--scale", type=float, default=1.0 / 255.0)
    p.add_argument("--channel-order", choices=["RGB", "BGR"], default="RGB")
    p.add_argument("--fixed-ms", type=float, default=0.0, help="simulated cost per call")
    p.add_argument("--per-image-ms", type=float, default=0.0, help="simulated cost per image")
    p.add_argument("--max-concurrency", type=int, default=1, help="calls computed at once (1 = one GPU)")
    p.add_argument("--fail-rate", type=float, default=0.0, help="share of calls answered UNAVAILABLE")
    p.add_argument("--fail-next", type=int, default=0, help="answer the next N calls UNAVAILABLE")
    a = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    model = ColourModel(list(a.labels), tuple(a.mean), tuple(a.std), a.scale, a.channel_order)
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(serve(
            0 if a.rest else a.port, host=a.host, stats_port=a.port if a.rest else a.stats_port, models=a.models, model=model,
            fixed_ms=a.fixed_ms, per_image_ms=a.per_image_ms, fail_rate=a.fail_rate,
            fail_next=a.fail_next, max_concurrency=a.max_concurrency,
        ))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
