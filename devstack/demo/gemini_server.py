"""Demo Gemini generateContent upstream; streams for `:streamGenerateContent?alt=sse`.

    python -m devstack.demo.gemini_server --port 8103 [--require-key-env VAR]

Answers as described in `devstack.demo.behaviour`, prefixed "[demo-gemini]"; also
`:embedContent` and `:batchEmbedContents`; generateContent asking for image output answers an image
(devstack/demo/cloud_images.py).
"""

from __future__ import annotations

import hmac

from aiohttp import web
from aiohttp.typedefs import Handler

from adapters import gemini
from adapters.registry import detect_client_protocol
from devstack.demo import cloud_images
from devstack.demo.adapter_server import AdapterDemo, DemoSite, parse, serve


def _path_info(request: web.Request) -> tuple[str | None, bool] | None:
    route = detect_client_protocol("POST", request.path)
    if route is None or route.protocol != "gemini" or (route.stream and request.query.get("alt") != "sse"):
        return None
    return route.model, route.stream


def make_app(name: str = "demo-gemini", require_key: str | None = None, chunk_delay: float = 0.0) -> web.Application:
    demo = AdapterDemo(gemini, f"[{name}]", require_key=require_key, chunk_delay=chunk_delay)
    app = demo.app("/v1beta/models/{tail}", _path_info, embeddings_path="/v1beta/models/{tail}")

    @web.middleware
    async def image_output(request: web.Request, handler: Handler) -> web.StreamResponse:
        """generateContent asking for image output (devstack/demo/cloud_images.py); the rest as chat."""
        if request.method == "POST" and request.path.endswith(":generateContent") \
                and cloud_images.wants_image(await request.read()):
            if require_key is not None and not hmac.compare_digest(
                    (gemini.client_api_key(request.headers, request.query) or "").encode(), require_key.encode()):
                return web.Response(status=401, body=gemini.render_error(401, "invalid upstream API key", None),
                                    content_type="application/json")
            demo.requests += 1
            status, answer = cloud_images.gemini_image(await request.read())
            return web.json_response(answer, status=status)
        return await handler(request)

    app.middlewares.append(image_output)
    return app


def build(argv: list[str] | None = None) -> DemoSite:
    return parse(argv, description="demo Gemini model server", default_port=8103, default_name="demo-gemini",
                 make_app=make_app)


def main(argv: list[str] | None = None) -> int:
    return serve(build(argv))


if __name__ == "__main__":
    raise SystemExit(main())
