"""Demo remote MCP server (streamable HTTP, FastMCP): the stand-in for a tool server a team runs.

    python -m devstack.demo.mcp_http_server --port 8131 [--name demo-http] [--require-token-env VAR]

With `--require-token-env`, every request must carry `Authorization: <that value>`: proof
that the gateway injects the server's own credential, and never the caller's gateway key.
"""

from __future__ import annotations

import argparse
import os

import uvicorn
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.types import ASGIApp, Receive, Scope, Send

from devstack.demo.mcp_tools import build


class _RequireToken:
    def __init__(self, app: ASGIApp, token: str) -> None:
        self.app, self.expected = app, token  # the whole header value, e.g. "Bearer <secret>"

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"] != "/health":
            got = dict(scope["headers"]).get(b"authorization", b"").decode()
            if got != self.expected:
                await JSONResponse({"error": "demo MCP server: wrong or missing token"}, 401)(scope, receive, send)
                return
        await self.app(scope, receive, send)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="demo MCP server over streamable HTTP")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8131)
    p.add_argument("--name", default="demo-http")
    p.add_argument("--require-token-env", default=None)
    args = p.parse_args(argv)
    server = build(args.name)

    @server.custom_route("/health", methods=["GET"])
    async def health(_request: Request) -> Response:
        return PlainTextResponse("ok")

    app: ASGIApp = server.streamable_http_app()
    token = os.environ.get(args.require_token_env) if args.require_token_env else None
    if token:
        app = _RequireToken(app, token)
    uvicorn.run(app, host=args.host, port=args.port, log_level="warning")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
