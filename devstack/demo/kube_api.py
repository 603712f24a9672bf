"""Demo Kubernetes API: the cluster `modelyard up`'s endpoint picker watches (`endpoint_picker.kubernetes.
api_server` on this host; `devstack.demo_kube_api` says what is in it). It holds one InferencePool
(inference.networking.k8s.io/v1: `spec.selector.matchLabels`, `spec.targetPorts`), its pods and
InferenceObjectives, and answers them as kube-apiserver does for the picker's calls: GET of the
pool; list (with `metadata.resourceVersion`, filtered by `labelSelector` or `fieldSelector=metadata.name=`) and watch
(`watch=1&resourceVersion=RV`: the events after RV, then live ones as newline-delimited JSON, a
BOOKMARK every 5 s with `allowWatchBookmarks=true`, the end at `timeoutSeconds`).

    python -m devstack.demo.kube_api --port 8125 --namespace demo --pool demo-vllm-pool \\
        --target-ports 8121,8122 --pod demo-vllm-0=127.0.0.1

Pods change on demand, as a cluster's would (the watch sees each change):
`POST /demo/pods/{name}` {"ip": "127.0.0.1", "ready": true} puts a Running pod (Ready or not),
`DELETE /demo/pods/{name}` deletes it, `POST /demo/objectives/{name}` {"priority": -1} puts an
InferenceObjective for the pool, `DELETE /demo/objectives/{name}` deletes it. `GET /healthz`.
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import itertools
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from devstack.demo.adapter_server import DemoSite, serve

PODS, OBJECTIVES, POOLS = "pods", "inferenceobjectives", "inferencepools"
KINDS = {PODS: "Pod", OBJECTIVES: "InferenceObjective", POOLS: "InferencePool"}
BOOKMARK_S = 5.0


def _status(code: int, reason: str, message: str) -> web.Response:
    return web.json_response({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                              "message": message, "reason": reason, "code": code}, status=code)


def inference_pool(namespace: str, name: str, selector: dict[str, str], target_ports: list[int]) -> dict[str, Any]:
    """An InferencePool (inference.networking.k8s.io/v1) selecting pods by labels, served at these ports."""
    return {"apiVersion": "inference.networking.k8s.io/v1", "kind": "InferencePool",
            "metadata": {"name": name, "namespace": namespace, "resourceVersion": "1"},
            "spec": {"selector": {"matchLabels": selector}, "targetPorts": [{"number": p} for p in target_ports],
                     "endpointPickerRef": {"name": "modelyard-epp", "port": {"number": 9002}}}}


@dataclass(frozen=True)
class Selector:
    """What a list or watch asks for: `labelSelector=k=v,...` and `fieldSelector=metadata.name=N`."""

    labels: tuple[tuple[str, str], ...] = ()
    name: str | None = None

    @classmethod
    def from_query(cls, q: Mapping[str, str]) -> Selector:
        labels = tuple((t.partition("=")[0], t.partition("=")[2]) for t in q.get("labelSelector", "").split(",") if t)
        field = q.get("fieldSelector", "")
        return cls(labels, field.removeprefix("metadata.name=") if field.startswith("metadata.name=") else None)

    def __call__(self, obj: dict[str, Any]) -> bool:
        meta = obj.get("metadata", {})
        labels = meta.get("labels") or {}
        return all(labels.get(k) == v for k, v in self.labels) and self.name in (None, meta.get("name"))


class KubeObjects:
    """One namespace's pods, InferencePools and InferenceObjectives as kube-apiserver keeps them: every
    change takes the next resourceVersion and is kept as the watch event it makes (the history a watch
    resuming from a version replays)."""

    def __init__(self, pool: dict[str, Any], rv: int) -> None:
        self.pool = pool
        self.items: dict[str, dict[str, dict[str, Any]]] = {PODS: {}, OBJECTIVES: {},
                                                            POOLS: {pool["metadata"]["name"]: pool}}
        self.rv = rv
        self.history: list[tuple[int, str, bytes]] = []  # (resourceVersion, collection, frame)

    def change(self, collection: str, name: str, obj: dict[str, Any] | None) -> tuple[bytes, dict[str, Any]] | None:
        """Put `obj` (None: delete it); the watch frame and the object it carries (None: nothing to delete)."""
        self.rv += 1
        old = self.items[collection].get(name)
        if obj is None:
            if old is None:
                return None
            del self.items[collection][name]
            obj, kind = copy.deepcopy(old), "DELETED"
        else:
            kind = "MODIFIED" if old is not None else "ADDED"
            self.items[collection][name] = obj
        obj["metadata"]["resourceVersion"] = str(self.rv)
        frame = json.dumps({"type": kind, "object": obj}).encode() + b"\n"
        self.history.append((self.rv, collection, frame))
        return frame, obj

    def listing(self, collection: str, selects: Selector) -> dict[str, Any]:
        """A list's answer: the selected objects and the version the list is as of."""
        return {"kind": f"{KINDS[collection]}List", "apiVersion": "v1", "metadata": {"resourceVersion": str(self.rv)},
                "items": [o for o in self.items[collection].values() if selects(o)]}


class DemoCluster(KubeObjects):
    def __init__(self, namespace: str, pool: str, target_ports: list[int], selector: dict[str, str]) -> None:
        super().__init__(inference_pool(namespace, pool, selector, target_ports), rv=100)
        self.ns, self.pool_name, self.selector = namespace, pool, selector
        self.watchers: list[tuple[str, asyncio.Queue[bytes | None]]] = []
        self._uids = itertools.count(1)

    def put(self, collection: str, name: str, obj: dict[str, Any] | None) -> None:
        made = self.change(collection, name, obj)  # a demo's history is short: kept whole
        if made is None:
            return
        for coll, q in self.watchers:
            if coll == collection:
                q.put_nowait(made[0])

    def pod(self, name: str, ip: str, ready: bool) -> dict[str, Any]:
        cond = "True" if ready else "False"
        return {"apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": name, "namespace": self.ns, "labels": dict(self.selector),
                             "uid": f"demo-{next(self._uids)}"},
                "spec": {"containers": [{"name": "model-server", "image": "modelyard-demo"}]},
                "status": {"phase": "Running", "podIP": ip, "podIPs": [{"ip": ip}],
                           "conditions": [{"type": t, "status": cond} for t in ("Ready", "ContainersReady")]
                           + [{"type": "PodScheduled", "status": "True"}]}}

    def objective(self, name: str, priority: int) -> dict[str, Any]:
        return {"apiVersion": "inference.networking.x-k8s.io/v1alpha2", "kind": "InferenceObjective",
                "metadata": {"name": name, "namespace": self.ns},
                "spec": {"priority": priority, "poolRef": {"group": "inference.networking.k8s.io",
                                                           "name": self.pool_name}}}

    # -- the API ------------------------------------------------------------------------------
    async def get_pool(self, request: web.Request) -> web.Response:
        if request.match_info["ns"] != self.ns or request.match_info["name"] != self.pool_name:
            return _status(404, "NotFound", f"inferencepools \"{request.match_info['name']}\" not found")
        return web.json_response(self.pool)

    async def collection(self, request: web.Request) -> web.StreamResponse:
        coll = request.path.rpartition("/")[2]
        if request.match_info["ns"] != self.ns:
            return web.json_response({"kind": f"{KINDS[coll]}List", "apiVersion": "v1",
                                      "metadata": {"resourceVersion": str(self.rv)}, "items": []})
        q = request.query
        match = Selector.from_query(q)  # the picker's pool watch names its pool
        if q.get("watch") not in ("1", "true"):
            return web.json_response(self.listing(coll, match))
        resp = web.StreamResponse(headers={"Content-Type": "application/json"})
        resp.enable_chunked_encoding()
        await resp.prepare(request)
        since = int(q.get("resourceVersion") or 0)
        queue: asyncio.Queue[bytes | None] = asyncio.Queue()
        for rv, c, past in self.history:
            if rv > since and c == coll:
                queue.put_nowait(past)
        self.watchers.append((coll, queue))
        loop = asyncio.get_running_loop()
        ends = loop.time() + float(q.get("timeoutSeconds") or 1800)
        try:
            while (left := ends - loop.time()) > 0:
                try:
                    frame: bytes | None = await asyncio.wait_for(queue.get(), min(left, BOOKMARK_S))
                except TimeoutError:
                    if q.get("allowWatchBookmarks") == "true":
                        mark = {"type": "BOOKMARK", "object": {"kind": KINDS[coll], "apiVersion": "v1",
                                                               "metadata": {"resourceVersion": str(self.rv)}}}
                        await resp.write(json.dumps(mark).encode() + b"\n")
                    continue
                if frame is None:
                    break
                if match(json.loads(frame)["object"]):
                    await resp.write(frame)
        finally:
            self.watchers.remove((coll, queue))
        await resp.write_eof()
        return resp

    # -- the demo's controls ------------------------------------------------------------------
    async def put_pod(self, request: web.Request) -> web.Response:
        body = await request.json() if request.can_read_body else {}
        name = request.match_info["name"]
        old = self.items[PODS].get(name)
        ip = body.get("ip") or (old["status"]["podIP"] if old else "127.0.0.1")
        pod = self.pod(name, str(ip), bool(body.get("ready", True)))
        if old is not None:
            pod["metadata"]["uid"] = old["metadata"]["uid"]  # the same pod, changed
        self.put(PODS, name, pod)
        return web.json_response(self.items[PODS][name])

    async def delete_pod(self, request: web.Request) -> web.Response:
        self.put(PODS, request.match_info["name"], None)
        return web.json_response({"deleted": request.match_info["name"]})

    async def put_objective(self, request: web.Request) -> web.Response:
        body = await request.json()
        name = request.match_info["name"]
        self.put(OBJECTIVES, name, self.objective(name, int(body.get("priority", 0))))
        return web.json_response(self.items[OBJECTIVES][name])

    async def delete_objective(self, request: web.Request) -> web.Response:
        self.put(OBJECTIVES, request.match_info["name"], None)
        return web.json_response({"deleted": request.match_info["name"]})

    async def healthz(self, _: web.Request) -> web.Response:
        return web.Response(text="ok")

    def app(self) -> web.Application:
        app = web.Application()
        r = app.router
        r.add_get("/apis/inference.networking.k8s.io/v1/namespaces/{ns}/inferencepools/{name}", self.get_pool)
        r.add_get("/api/v1/namespaces/{ns}/pods", self.collection)
        r.add_get("/apis/inference.networking.x-k8s.io/v1alpha2/namespaces/{ns}/inferenceobjectives", self.collection)
        r.add_get("/apis/inference.networking.k8s.io/v1/namespaces/{ns}/inferencepools", self.collection)
        r.add_post("/demo/pods/{name}", self.put_pod)
        r.add_delete("/demo/pods/{name}", self.delete_pod)
        r.add_post("/demo/objectives/{name}", self.put_objective)
        r.add_delete("/demo/objectives/{name}", self.delete_objective)
        r.add_get("/healthz", self.healthz)

        async def close_watches(_: web.Application) -> None:  # a stop ends the watches, not waits on them
            for _coll, q in list(self.watchers):
                q.put_nowait(None)

        app.on_shutdown.append(close_watches)
        return app


def build(argv: list[str] | None = None) -> DemoSite:
    p = argparse.ArgumentParser(description="demo Kubernetes API: an InferencePool, its pods and objectives")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8125)
    p.add_argument("--namespace", default="demo")
    p.add_argument("--pool", default="demo-vllm-pool")
    p.add_argument("--target-ports", default="8121,8122", help="the pool's targetPorts, comma-separated")
    p.add_argument("--selector", default="app.kubernetes.io/name=demo-vllm", help="the pool's matchLabels, k=v,...")
    p.add_argument("--pod", action="append", default=[], metavar="NAME=IP", help="a Running, Ready pod")
    a = p.parse_args(argv)
    selector = dict(t.partition("=")[::2] for t in a.selector.split(",") if t)
    cluster = DemoCluster(a.namespace, a.pool, [int(x) for x in a.target_ports.split(",") if x], selector)
    for spec in a.pod:
        name, _, ip = spec.partition("=")
        cluster.put(PODS, name, cluster.pod(name, ip or "127.0.0.1", True))
    return DemoSite(cluster.app(), a.host, a.port)


def main(argv: list[str] | None = None) -> int:
    return serve(build(argv))


if __name__ == "__main__":
    raise SystemExit(main())
