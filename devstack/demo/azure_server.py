"""Demo Azure OpenAI upstream: OpenAI's chat wire at Azure's deployment paths, checking what Azure
checks: the `api-version` query parameter and the `api-key` header (or an Entra bearer token).

    python -m devstack.demo.azure_server --port 8106 [--name demo-azure] [--require-key-env VAR]

Answers as described in `devstack.demo.behaviour`, with Azure's content-filter annotations; a
stream opens with Azure's prompt-filter chunk.
"""

from __future__ import annotations

import re

from aiohttp import web

from adapters import azure_openai
from devstack.demo.adapter_server import AdapterDemo, DemoSite, parse, serve

# The versions this demo serves, as a real resource serves a known list (a preview suffix allowed).
_API_VERSION = re.compile(r"^20\d\d-\d\d-\d\d(-preview)?$")
PATH = "/openai/deployments/{deployment}/chat/completions"


def _path_info(request: web.Request) -> tuple[str | None, bool] | None:
    """The deployment from the path; None (404, as Azure answers) without a served api-version."""
    if not _API_VERSION.match(request.query.get("api-version", "")):
        return None
    return request.match_info["deployment"], False


def make_app(name: str = "demo-azure", require_key: str | None = None, chunk_delay: float = 0.0) -> web.Application:
    demo = AdapterDemo(azure_openai, f"[{name}]", require_key=require_key, chunk_delay=chunk_delay)
    return demo.app(PATH, _path_info)


def build(argv: list[str] | None = None) -> DemoSite:
    return parse(argv, description="demo Azure OpenAI model server", default_port=8106, default_name="demo-azure",
                 make_app=make_app)


def main(argv: list[str] | None = None) -> int:
    return serve(build(argv))


if __name__ == "__main__":
    raise SystemExit(main())
