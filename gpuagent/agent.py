"""`modelyard agent`: GPU watermarks of one node over HTTP, for the gateway's pollers.

GET /watermarks  {"source": "nvml"|"fake", "gpus": [{"index", "util", "mem_used", "mem_total"}],
                  "watermark": max over GPUs of max(util/100, mem_used/mem_total), "ts": unix time}
GET /metrics     the same as Prometheus text
POST /fake       set the fake source's values (fake mode only), body as for --fake-file

Without NVML (no driver, no GPU) the agent logs why and exits with status 2, unless run with a
fake source (`--fake`, `--fake-util 0.3 --fake-mem 0.2`, or `--fake-file path.json`, re-read on
every request). A fake spec is {"util": 0.3, "mem": 0.2, "gpus": 1} with fractions, or
{"gpus": [{"util": 30, "mem_used": 8e9, "mem_total": 80e9}, ...]} in NVML units.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
import time
from pathlib import Path
from typing import Any, Protocol

import orjson
from aiohttp import web

from contracts.watermarks import GpuReading, WatermarkParseError, parse_agent_json, watermark_of

log = logging.getLogger("modelyard.agent")

EXIT_NO_NVML = 2
_FAKE_MEM_TOTAL = 80 * 1024**3


class NvmlUnavailable(RuntimeError):
    """NVML cannot be used on this machine (no library, no driver or no GPU)."""


class GpuSource(Protocol):
    name: str

    def read(self) -> list[GpuReading]: ...


class NvmlSource:
    """Reads utilization.gpu and memory per GPU through nvidia-ml-py."""

    name = "nvml"

    def __init__(self) -> None:
        try:
            import pynvml
        except ImportError as e:  # pragma: no cover - nvidia-ml-py is a dependency
            raise NvmlUnavailable(f"nvidia-ml-py is not installed ({e})") from None
        self._nvml = pynvml
        try:
            pynvml.nvmlInit()
            count = pynvml.nvmlDeviceGetCount()
        except pynvml.NVMLError as e:
            raise NvmlUnavailable(f"NVML is not available: {e}") from None
        if count == 0:
            raise NvmlUnavailable("NVML found no GPU")
        self._handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(count)]

    def read(self) -> list[GpuReading]:
        nv = self._nvml
        out = []
        for i, h in enumerate(self._handles):
            util = nv.nvmlDeviceGetUtilizationRates(h)
            mem = nv.nvmlDeviceGetMemoryInfo(h)
            out.append(GpuReading(i, float(util.gpu), float(mem.used), float(mem.total)))
        return out


def parse_fake_spec(doc: Any) -> list[GpuReading]:
    """A fake spec (see module doc) as GPU readings; WatermarkParseError (status 400) if bad."""
    if not isinstance(doc, dict):
        raise WatermarkParseError("fake spec: expected a JSON object")
    if isinstance(doc.get("gpus"), list):
        return list(parse_agent_json(orjson.dumps({"gpus": doc["gpus"]})).gpus)
    util, mem, n = doc.get("util", 0.0), doc.get("mem", 0.0), doc.get("gpus", 1)
    for key, v in (("util", util), ("mem", mem)):
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0.0 <= v <= 1.0:
            raise WatermarkParseError(f"fake spec: {key} must be a fraction in [0, 1]")
    if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= 64:
        raise WatermarkParseError("fake spec: gpus must be an integer in [1, 64] or a list")
    return [GpuReading(i, util * 100.0, mem * _FAKE_MEM_TOTAL, float(_FAKE_MEM_TOTAL)) for i in range(n)]


class FakeSource:
    """Fixed values (settable with POST /fake) or a JSON file re-read on every request."""

    name = "fake"

    def __init__(self, util: float = 0.0, mem: float = 0.0, path: str | None = None) -> None:
        self.path = Path(path) if path else None
        self.gpus = parse_fake_spec({"util": util, "mem": mem})

    def set(self, doc: Any) -> None:
        self.gpus = parse_fake_spec(doc)
        self.path = None  # an explicit value wins over the file from now on

    def read(self) -> list[GpuReading]:
        if self.path is not None:
            try:
                return parse_fake_spec(orjson.loads(self.path.read_bytes()))
            except (OSError, orjson.JSONDecodeError) as e:
                raise WatermarkParseError(f"fake file {self.path}: {e}") from None
        return self.gpus


def snapshot(source: GpuSource, gpus: list[GpuReading]) -> dict[str, Any]:
    return {
        "source": source.name,
        "gpus": [
            {"index": g.index, "util": g.util, "mem_used": g.mem_used, "mem_total": g.mem_total}
            for g in gpus
        ],
        "watermark": watermark_of(gpus),
        "ts": time.time(),
    }


def render_metrics(doc: dict[str, Any]) -> str:
    lines = [
        "# HELP modelyard_gpu_utilization GPU utilization (0..1).",
        "# TYPE modelyard_gpu_utilization gauge",
    ]
    lines += [f'modelyard_gpu_utilization{{gpu="{g["index"]}"}} {g["util"] / 100.0}' for g in doc["gpus"]]
    lines += ["# HELP modelyard_gpu_memory_used_bytes GPU memory used.", "# TYPE modelyard_gpu_memory_used_bytes gauge"]
    lines += [f'modelyard_gpu_memory_used_bytes{{gpu="{g["index"]}"}} {g["mem_used"]}' for g in doc["gpus"]]
    lines += ["# HELP modelyard_gpu_memory_total_bytes GPU memory total.", "# TYPE modelyard_gpu_memory_total_bytes gauge"]
    lines += [f'modelyard_gpu_memory_total_bytes{{gpu="{g["index"]}"}} {g["mem_total"]}' for g in doc["gpus"]]
    lines += [
        "# HELP modelyard_gpu_watermark Max over GPUs of max(utilization, memory used fraction).",
        "# TYPE modelyard_gpu_watermark gauge",
        f'modelyard_gpu_watermark{{source="{doc["source"]}"}} {doc["watermark"]}',
    ]
    return "\n".join(lines) + "\n"


def _json(doc: Any, status: int = 200) -> web.Response:
    return web.Response(body=orjson.dumps(doc), status=status, content_type="application/json")


def make_app(source: GpuSource) -> web.Application:
    async def current() -> dict[str, Any]:
        # NVML calls block briefly; keep them off the event loop.
        gpus = await asyncio.get_running_loop().run_in_executor(None, source.read)
        return snapshot(source, gpus)

    async def watermarks(_: web.Request) -> web.Response:
        try:
            return _json(await current())
        except WatermarkParseError as e:
            return _json({"error": str(e)}, 500)

    async def metrics(_: web.Request) -> web.Response:
        try:
            doc = await current()
        except WatermarkParseError as e:
            return web.Response(text=f"# error: {e}\n", status=500)
        return web.Response(text=render_metrics(doc), content_type="text/plain", charset="utf-8")

    async def set_fake(request: web.Request) -> web.Response:
        if not isinstance(source, FakeSource):
            return _json({"error": "POST /fake works only with a fake source"}, 409)
        try:
            source.set(orjson.loads(await request.read()))
        except orjson.JSONDecodeError as e:
            return _json({"error": f"not JSON: {e}"}, 400)
        except WatermarkParseError as e:
            return _json({"error": str(e)}, 400)
        return _json(snapshot(source, source.read()))

    app = web.Application()
    app.router.add_get("/watermarks", watermarks)
    app.router.add_get("/metrics", metrics)
    app.router.add_post("/fake", set_fake)
    return app


def _fraction(text: str) -> float:
    v = float(text)
    if not 0.0 <= v <= 1.0:
        raise argparse.ArgumentTypeError(f"{text} is not a fraction in [0, 1]")
    return v


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="modelyard agent", description="GPU watermarks over HTTP")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=8301)
    ap.add_argument("--fake", action="store_true", help="serve fake values instead of NVML")
    ap.add_argument("--fake-file", default=None, help="JSON fake spec, re-read on every request")
    ap.add_argument("--fake-util", type=_fraction, default=None, help="fake utilization fraction")
    ap.add_argument("--fake-mem", type=_fraction, default=None, help="fake memory fraction")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    fake = args.fake or args.fake_file is not None or args.fake_util is not None or args.fake_mem is not None
    source: GpuSource
    if fake:
        source = FakeSource(args.fake_util or 0.0, args.fake_mem or 0.0, args.fake_file)
    else:
        try:
            source = NvmlSource()
        except NvmlUnavailable as e:
            log.error("%s; cannot report GPU watermarks (run with --fake for a fake source)", e)
            return EXIT_NO_NVML
    log.info("serving %s watermarks on http://%s:%d/watermarks", source.name, args.host, args.port)
    web.run_app(make_app(source), host=args.host, port=args.port, print=None)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
