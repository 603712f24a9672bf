"""Demo Anthropic Messages upstream.

    python -m devstack.demo.anthropic_server --port 8102 [--require-key-env VAR]

Answers as described in `devstack.demo.behaviour`, prefixed "[demo-anthropic]"; also Anthropic's
Message Batches (`devstack.demo.batch_api`).
"""

from __future__ import annotations

from aiohttp import web

from adapters import anthropic
from devstack.demo.adapter_server import AdapterDemo, DemoSite, parse, serve
from devstack.demo.batch_api import add_anthropic_batch_routes


def make_app(name: str = "demo-anthropic", require_key: str | None = None, chunk_delay: float = 0.0) -> web.Application:
    app = AdapterDemo(anthropic, f"[{name}]", require_key=require_key, chunk_delay=chunk_delay).app(anthropic.PATH)
    add_anthropic_batch_routes(app, anthropic, f"[{name}]", require_key)  # Message Batches (native batches)
    return app


def build(argv: list[str] | None = None) -> DemoSite:
    return parse(argv, description="demo Anthropic Messages model server", default_port=8102,
                 default_name="demo-anthropic", make_app=make_app)


def main(argv: list[str] | None = None) -> int:
    return serve(build(argv))


if __name__ == "__main__":
    raise SystemExit(main())
