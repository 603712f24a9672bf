"""Demo OpenAI Chat Completions upstream: the stand-in for a model endpoint a team already runs.

    python -m devstack.demo.openai_server --port 8101 [--name demo-openai] [--require-key-env VAR]

Answers as described in `devstack.demo.behaviour`, prefixed "[<name>]"; also POST /v1/embeddings,
OpenAI's images and audio endpoints (`devstack.demo.media`), its Files + Batches
(`devstack.demo.batch_api`) and /v1/moderations (`devstack.demo.moderation`).
"""

from __future__ import annotations

from aiohttp import web

from adapters import embeddings, openai
from devstack.demo.adapter_server import AdapterDemo, DemoSite, parse, serve
from devstack.demo.batch_api import add_openai_batch_routes
from devstack.demo.media import add_media_routes
from devstack.demo.moderation import add_moderation_routes


def make_app(name: str = "demo-openai", require_key: str | None = None, chunk_delay: float = 0.0) -> web.Application:
    demo = AdapterDemo(openai, f"[{name}]", require_key=require_key, chunk_delay=chunk_delay)
    app = demo.app(openai.PATH, embeddings_path=embeddings.OPENAI_PATH)
    add_media_routes(app, f"[{name}]")  # images and audio (demo-image, demo-whisper, demo-tts)
    add_openai_batch_routes(app, openai, f"[{name}]", require_key)  # Files + Batches (native batches)
    add_moderation_routes(app)  # /v1/moderations (demo-moderation)
    return app


def build(argv: list[str] | None = None) -> DemoSite:
    return parse(argv, description="demo OpenAI-compatible model server", default_port=8101,
                 default_name="demo-openai", make_app=make_app)


def main(argv: list[str] | None = None) -> int:
    return serve(build(argv))


if __name__ == "__main__":
    raise SystemExit(main())
