"""Demo scaler: the stand-in for whatever brings up a model server with no replica running (a
`scale_from_zero:` deployment, docs/queueing.md "Scale from zero").

    python -m devstack.demo.scaler --port 8190 --upstream-port 8105 [--name demo-cold] [--start-delay 2]

It answers the Kubernetes API's scale subresource (`PATCH /apis/apps/v1/namespaces/{ns}/deployments/
{name}/scale`, a merge patch of `spec.replicas`) and a scale webhook (`POST /scale`) alike: it records
the call and, `--start-delay` seconds later, starts the demo OpenAI server on `--upstream-port` in this
process (the replica). `GET /calls` lists what it was asked; `GET /health` says it runs.
"""

from __future__ import annotations

import argparse
import asyncio
import time

from aiohttp import web

from devstack.demo.adapter_server import DemoSite, serve
from devstack.demo.openai_server import make_app


class Scaler:
    def __init__(self, upstream_port: int, *, name: str = "demo-cold", start_delay_s: float | None = 2.0,
                 host: str = "127.0.0.1") -> None:
        """`start_delay_s=None`: the replica starts only when `start_now` is awaited (tests pace it)."""
        self.upstream = (host, upstream_port)
        self.name = name
        self.start_delay_s = start_delay_s
        self.calls: list[dict[str, object]] = []
        self.started_at: float | None = None  # monotonic: when the replica began to listen
        self._runner: web.AppRunner | None = None
        self._starting: asyncio.Task[None] | None = None

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_patch("/apis/apps/v1/namespaces/{ns}/deployments/{deployment}/scale", self._k8s_scale)
        app.router.add_post("/scale", self._webhook)
        app.router.add_get("/calls", self._list)
        app.router.add_get("/health", self._health)
        app.on_cleanup.append(self._stop)
        return app

    async def _k8s_scale(self, request: web.Request) -> web.Response:
        body = await request.json()
        if request.content_type != "application/merge-patch+json" or not request.headers.get(
                "authorization", "").startswith("Bearer "):
            return web.json_response({"kind": "Status", "status": "Failure", "code": 401}, status=401)
        replicas = int(body["spec"]["replicas"])
        self._record(request, {"replicas": replicas, "content_type": request.content_type,
                               "authorization": request.headers["authorization"]})
        ns, dep = request.match_info["ns"], request.match_info["deployment"]
        return web.json_response({"kind": "Scale", "apiVersion": "autoscaling/v1",
                                  "metadata": {"name": dep, "namespace": ns},
                                  "spec": {"replicas": replicas}, "status": {"replicas": 0}})

    async def _webhook(self, request: web.Request) -> web.Response:
        self._record(request, await request.json())
        return web.json_response({"accepted": True}, status=202)

    async def _health(self, _: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    async def _list(self, _: web.Request) -> web.Response:
        return web.json_response({"calls": self.calls, "started": self.started_at is not None})

    def _record(self, request: web.Request, what: dict[str, object]) -> None:
        self.calls.append({"method": request.method, "path": request.path, "at": time.monotonic(), **what})
        if self._starting is None:
            self._starting = asyncio.get_running_loop().create_task(self._start())

    async def _start(self) -> None:
        if self.start_delay_s is None:
            return
        await asyncio.sleep(self.start_delay_s)
        await self.start_now()

    async def start_now(self) -> None:
        """Start the replica (on the scaler's own loop); a second call does nothing."""
        if self._runner is not None:
            return
        self._runner = web.AppRunner(make_app(self.name))
        await self._runner.setup()
        await web.TCPSite(self._runner, *self.upstream).start()
        self.started_at = time.monotonic()

    async def _stop(self, _: web.Application) -> None:
        if self._starting is not None:
            self._starting.cancel()
        if self._runner is not None:
            await self._runner.cleanup()


def build(argv: list[str] | None = None) -> DemoSite:
    """The scaler from its command line, not yet listening (devstack.demo.host runs it beside other demos)."""
    p = argparse.ArgumentParser(description="demo scaler: starts a demo OpenAI server when asked to scale")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8190)
    p.add_argument("--upstream-port", type=int, required=True)
    p.add_argument("--name", default="demo-cold")
    p.add_argument("--start-delay", type=float, default=2.0)
    a = p.parse_args(argv)
    scaler = Scaler(a.upstream_port, name=a.name, start_delay_s=a.start_delay, host=a.host)
    return DemoSite(scaler.app(), a.host, a.port)


def main(argv: list[str] | None = None) -> int:
    return serve(build(argv))


if __name__ == "__main__":
    raise SystemExit(main())
