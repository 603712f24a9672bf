"""The stack the drop_params and large-answer tests share: a few demo models on free ports, with
drop_params set on some, and a max_body_bytes a 2048 x 1536 Gemini embeddings answer fits under."""

from __future__ import annotations

import os
import urllib.request
from pathlib import Path
from typing import Any

import orjson
from aiohttp import web

from tests.conftest import UPSTREAM_KEYS
from tests.stack_config import demo_config_free_ports, start_stack
from tests.threaded_app import ThreadedApp

# ~30 MB: a 2048 x 1536 Gemini batchEmbedContents answer (~29.9 MB of demo JSON) fits; 2048 x 1800 does not.
MAX_BODY_BYTES = 31 * 1024 * 1024


# Envoy's own buffer (the environment's buffer_limit_bytes, 32 MiB by default): a chunked answer past it
ENVOY_BUFFER_BYTES = 32 * 1024 * 1024


def chunked_upstream() -> ThreadedApp:
    """An OpenAI- and Gemini-shaped upstream whose answers come chunked (no content-length), 34 MiB
    of text: past Envoy's buffer before the extproc could see a byte of it."""
    text = "x" * (ENVOY_BUFFER_BYTES + 2 * 1024 * 1024)

    async def answer(request: web.Request) -> web.StreamResponse:
        # "small" in the request: a short chunked answer, "[chunked] small" (one that fits every buffer)
        says = "[chunked] small" if b"small" in await request.read() else text
        if request.path.endswith(":generateContent"):
            body = orjson.dumps({"candidates": [{"content": {"role": "model", "parts": [{"text": says}]},
                                                 "finishReason": "STOP"}]})
        else:
            body = orjson.dumps({"id": "c", "object": "chat.completion", "created": 1, "model": "m",
                                 "choices": [{"index": 0, "finish_reason": "stop",
                                              "message": {"role": "assistant", "content": says}}]})
        resp = web.StreamResponse(headers={"content-type": "application/json"})
        resp.enable_chunked_encoding()
        await resp.prepare(request)
        step = 1 << 20 if len(body) > 1 << 20 else 16  # a small one in several pieces too
        for i in range(0, len(body), step):
            await resp.write(body[i:i + step])
        await resp.write_eof()
        return resp

    app = web.Application()
    app.router.add_post("/v1/chat/completions", answer)
    app.router.add_post("/v1beta/models/{tail}", answer)
    return ThreadedApp(app)


def params_config(chunked_port: int | None = None) -> dict[str, Any]:
    data, _ = demo_config_free_ports()
    keep = {"demo-gpt", "demo-claude", "demo-embed", "demo-embed-gemini"}
    models = [m for m in data["models"] if m["name"] in keep]
    for m in models:
        m.pop("groups", None)
        for d in m["deployments"]:
            d.pop("watermark", None)
            d.pop("warmup", None)
    gpt = next(m for m in models if m["name"] == "demo-gpt")
    gpt["deployments"] = gpt["deployments"][:1]
    claude = next(m for m in models if m["name"] == "demo-claude")
    # The same upstreams under models whose policy drops: all (model-wide) or seed (the deployment's).
    models.append({**gpt, "name": "demo-gpt-drop", "drop_params": True})
    models.append({**claude, "name": "demo-claude-drop",
                   "deployments": [{**d, "drop_params": ["seed"]} for d in claude["deployments"]]})
    if chunked_port is not None:
        ep = [f"127.0.0.1:{chunked_port}"]
        models.append({"name": "chunky-openai", "deployments": [
            {"cluster": "chunky-openai", "protocol": "openai", "endpoints": ep}]})
        models.append({"name": "chunky-gemini", "deployments": [
            {"cluster": "chunky-gemini", "protocol": "gemini", "endpoints": ep}]})
    data["models"] = models
    data["tenants"] = [t for t in data["tenants"] if t["name"] == "demo"]
    data.pop("ratelimit", None)
    data.pop("routing", None)
    data["extproc"]["max_body_bytes"] = MAX_BODY_BYTES
    return data


def start(workdir: Path, chunked_port: int | None = None):
    for name, value in UPSTREAM_KEYS.items():
        os.environ.setdefault(name, value)
    return start_stack(workdir, params_config(chunked_port), shared_demos=True)


def metric(stack: Any, name: str, labels: dict[str, str]) -> float:
    """The sum of `name`'s samples whose labels include `labels`, from the extproc's /metrics."""
    text = urllib.request.urlopen(f"http://{stack.cfg.extproc.metrics_address}/metrics", timeout=5).read().decode()
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name + "{") and all(f'{k}="{v}"' in line for k, v in labels.items()):
            total += float(line.rsplit(" ", 1)[1])
    return total
