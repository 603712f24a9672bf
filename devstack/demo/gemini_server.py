"""Demo Gemini generateContent upstream; streams for `:streamGenerateContent?alt=sse`.

    python -m devstack.demo.gemini_server --port 8103 [--require-key-env VAR]

Answers as described in `devstack.demo.behaviour`, prefixed "[demo-gemini]"; also
`:embedContent` and `:batchEmbedContents`.
"""

from __future__ import annotations

from aiohttp import web

from adapters import gemini
from adapters.registry import detect_client_protocol
from devstack.demo.adapter_server import AdapterDemo, DemoSite, parse, serve


def _path_info(request: web.Request) -> tuple[str | None, bool] | None:
    route = detect_client_protocol("POST", request.path)
    if route is None or route.protocol != "gemini" or (route.stream and request.query.get("alt") != "sse"):
        return None
    return route.model, route.stream


def make_app(name: str = "demo-gemini", require_key: str | None = None, chunk_delay: float = 0.0) -> web.Application:
    demo = AdapterDemo(gemini, f"[{name}]", require_key=require_key, chunk_delay=chunk_delay)
    return demo.app("/v1beta/models/{tail}", _path_info, embeddings_path="/v1beta/models/{tail}")


def build(argv: list[str] | None = None) -> DemoSite:
    return parse(argv, description="demo Gemini model server", default_port=8103, default_name="demo-gemini",
                 make_app=make_app)


def main(argv: list[str] | None = None) -> int:
    return serve(build(argv))


if __name__ == "__main__":
    raise SystemExit(main())
