"""Demo Anthropic Messages upstream.

    python -m devstack.demo.anthropic_server --port 8102 [--require-key-env VAR]

Answers as described in `devstack.demo.behaviour`, prefixed "[demo-anthropic]".
"""

from __future__ import annotations

from aiohttp import web

from adapters import anthropic
from devstack.demo.adapter_server import AdapterDemo, DemoSite, parse, serve


def make_app(name: str = "demo-anthropic", require_key: str | None = None, chunk_delay: float = 0.0) -> web.Application:
    return AdapterDemo(anthropic, f"[{name}]", require_key=require_key, chunk_delay=chunk_delay).app(anthropic.PATH)


def build(argv: list[str] | None = None) -> DemoSite:
    return parse(argv, description="demo Anthropic Messages model server", default_port=8102,
                 default_name="demo-anthropic", make_app=make_app)


def main(argv: list[str] | None = None) -> int:
    return serve(build(argv))


if __name__ == "__main__":
    raise SystemExit(main())
