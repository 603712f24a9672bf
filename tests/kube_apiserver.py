"""A stand-in for kube-apiserver's list and watch of pods, InferencePools and InferenceObjectives,
for the endpoint picker's end-to-end tests (no real apiserver installs here: see
tests/replicas/kube/SOURCES.md). Its objects, versions and history are devstack's demo API's
(`devstack.demo.kube_api.KubeObjects`); this one adds what a test needs of a real server. It answers from recorded real responses: each pod is the recorded
Running+Ready pod (tests/replicas/kube/pulumi-pod-ready.json) with its name, labels, podIP,
readiness and resourceVersion set; the 410 and BOOKMARK frames are the recorded ones with their
resourceVersion set. The protocol as the real server speaks it over HTTP/1.1:

- a list answers the collection and its `metadata.resourceVersion`;
- a watch (`watch=1&resourceVersion=RV`) replays every event after RV from its history, then
  streams live events as chunked newline-delimited JSON, a BOOKMARK every second when asked;
- a watch from a version older than the history (`expire`) gets HTTP 200 then the ERROR 410 frame;
- `close_watches` ends every open watch as a server's timeout does; `hold_watches` keeps new watch
  requests waiting (the client has reconnected but sees nothing yet), so a test can change things
  between two watches and check that the second one replays them.
"""

from __future__ import annotations

import copy
import itertools
import json
import queue
import ssl
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

from devstack.demo.kube_api import KINDS, OBJECTIVES, PODS, POOLS, KubeObjects, Selector, inference_pool

RECORDED = Path(__file__).parent / "replicas" / "kube"
POD = json.loads((RECORDED / "pulumi-pod-ready.json").read_text())
EXPIRED_FRAME, BOOKMARK_FRAME = (json.loads(line) for line in (RECORDED / "watch-frames.jsonl").read_bytes().splitlines())

POOLS_PREFIX = "/apis/inference.networking.k8s.io/v1/namespaces/{ns}/inferencepools/"
COLLECTIONS = {"/api/v1/namespaces/{ns}/pods": PODS,
               "/apis/inference.networking.x-k8s.io/v1alpha2/namespaces/{ns}/inferenceobjectives": OBJECTIVES,
               "/apis/inference.networking.k8s.io/v1/namespaces/{ns}/inferencepools": POOLS}
_END = object()


class KubeApiStandIn(KubeObjects):
    def __init__(self, namespace: str, pool_name: str, selector: dict[str, str], port: int, *,
                 tls: tuple[Path, Path] | None = None, token: str | None = None) -> None:
        """`tls`: (certificate, key) to serve HTTPS; `token`: the bearer token every request must carry
        (401 otherwise), as a real server with a service account's token would check it."""
        self.token = token
        self.gone_as_status = False  # a too-old watch gets HTTP 410 instead of 200 and the ERROR frame
        super().__init__(inference_pool(namespace, pool_name, selector, [port]), rv=1000)
        self.ns = namespace
        self.selector = selector
        self.oldest = 0  # a watch from before this version is answered 410
        self.lock = threading.Lock()
        self.watchers: list[tuple[str, Selector, queue.Queue[object]]] = []
        self.requests: list[tuple[str, dict[str, str]]] = []  # (collection or path, query)
        self.held = threading.Event()
        self.held.set()
        self.waiting = 0  # watch requests held now
        self._uids = itertools.count(1)
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.server.daemon_threads = True
        if tls is not None:
            ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            ctx.load_cert_chain(*tls)
            self.server.socket = ctx.wrap_socket(self.server.socket, server_side=True)
        self.port = int(self.server.server_address[1])
        self.url = f"{'https' if tls else 'http'}://127.0.0.1:{self.port}"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    # -- the test's side ---------------------------------------------------------------------
    def start(self) -> KubeApiStandIn:
        self._thread.start()
        return self

    def stop(self) -> None:
        self.held.set()
        self.close_watches()
        self.server.shutdown()
        self.server.server_close()

    def put_pod(self, name: str, ip: str, ready: bool = True, labels: dict[str, str] | None = None) -> None:
        pod = copy.deepcopy(POD)
        meta = pod["metadata"]
        meta.update(name=name, namespace=self.ns, labels=dict(self.selector if labels is None else labels), uid=f"00000000-0000-0000-0000-{next(self._uids):012d}",
                    selfLink=f"/api/v1/namespaces/{self.ns}/pods/{name}")
        pod["status"]["podIP"] = ip
        for cond in pod["status"]["conditions"]:
            if cond["type"] in ("Ready", "ContainersReady"):
                cond["status"] = "True" if ready else "False"
        self._change(PODS, name, pod)

    def put_pool(self, selector: dict[str, str] | None = None, port: int | None = None) -> None:
        """The InferencePool edited: another selector or target port."""
        pool = copy.deepcopy(self.pool)
        if selector is not None:
            pool["spec"]["selector"]["matchLabels"] = selector
        if port is not None:
            pool["spec"]["targetPorts"] = [{"number": port}]
        self.pool = pool
        self._change(POOLS, pool["metadata"]["name"], pool)

    def delete_pod(self, name: str) -> None:
        self._change(PODS, name, None)

    def put_objective(self, name: str, priority: int, pool: str | None = None) -> None:
        obj = {"apiVersion": "inference.networking.x-k8s.io/v1alpha2", "kind": "InferenceObjective",
               "metadata": {"name": name, "namespace": self.ns},
               "spec": {"priority": priority, "poolRef": {"group": "inference.networking.k8s.io",
                                                          "name": pool or self.pool["metadata"]["name"]}}}
        self._change(OBJECTIVES, name, obj)

    def close_watches(self) -> None:
        """Every open watch ends (the server's timeout, a restart)."""
        with self.lock:
            for _, _, q in self.watchers:
                q.put(_END)

    def hold_watches(self) -> None:
        self.held.clear()

    def release_watches(self) -> None:
        self.held.set()

    def expire(self) -> None:
        """The history so far is compacted away: a watch resuming from before now gets 410."""
        with self.lock:
            self.oldest = self.rv  # a watch from the current version still resumes
            self.history.clear()

    def lists(self, collection: str) -> int:
        return sum(1 for c, q in self.requests if c == collection and q.get("watch") != "1")

    def watches(self, collection: str) -> list[dict[str, str]]:
        return [q for c, q in self.requests if c == collection and q.get("watch") == "1"]

    def wait_for(self, predicate: Any, limit_s: float = 10.0) -> None:
        deadline = time.monotonic() + limit_s
        while not predicate():
            assert time.monotonic() < deadline, "the picker never did what the test waits for"
            time.sleep(0.02)

    # -- the server's side -------------------------------------------------------------------
    def _change(self, collection: str, name: str, obj: dict[str, Any] | None) -> None:
        with self.lock:
            made = self.change(collection, name, obj)
            if made is None:
                return
            for coll, selects, q in self.watchers:
                if coll == collection and selects(made[1]):
                    q.put(made[0])

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        api = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def _json(self, status: int, body: dict[str, Any]) -> None:
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _chunk(self, data: bytes) -> None:
                self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
                self.wfile.flush()

            def do_GET(self) -> None:  # noqa: N802
                url = urlsplit(self.path)
                q = {k: v[-1] for k, v in parse_qs(url.query).items()}
                if api.token is not None and self.headers.get("Authorization") != f"Bearer {api.token}":
                    api.requests.append(("unauthorized", q))
                    return self._json(401, {"kind": "Status", "apiVersion": "v1", "status": "Failure",
                                            "message": "Unauthorized", "reason": "Unauthorized", "code": 401})
                pools = POOLS_PREFIX.format(ns=api.ns)
                if url.path.startswith(pools):
                    api.requests.append((url.path, q))
                    if url.path[len(pools):] == api.pool["metadata"]["name"]:
                        return self._json(200, api.pool)
                    return self._json(404, {"kind": "Status", "apiVersion": "v1", "status": "Failure",
                                            "reason": "NotFound", "code": 404})
                collection = COLLECTIONS.get(url.path.replace(f"/{api.ns}/", "/{ns}/", 1))
                if collection is None:
                    return self._json(404, {"kind": "Status", "apiVersion": "v1", "status": "Failure",
                                            "reason": "NotFound", "code": 404})
                api.requests.append((collection, q))
                selector = Selector.from_query(q)
                if q.get("watch") != "1":
                    with api.lock:
                        listing = api.listing(collection, selector)
                    return self._json(200, listing)
                self._watch(collection, selector, q)

            def _watch(self, collection: str, selector: Selector, q: dict[str, str]) -> None:
                with api.lock:
                    api.waiting += 1
                api.held.wait()
                with api.lock:
                    api.waiting -= 1
                    gone = int(q.get("resourceVersion") or 0) < api.oldest and api.gone_as_status
                if gone:
                    status = copy.deepcopy(EXPIRED_FRAME["object"])
                    status["message"] = f"too old resource version: {q.get('resourceVersion')} ({api.rv})"
                    return self._json(410, status)
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Transfer-Encoding", "chunked")
                self.send_header("Connection", "close")  # it ends a watch by closing the connection
                self.end_headers()
                since = int(q.get("resourceVersion") or 0)
                events: queue.Queue[object] = queue.Queue()
                with api.lock:
                    expired = since < api.oldest
                    if not expired:
                        for rv, coll, frame in api.history:
                            if rv > since and coll == collection and selector(json.loads(frame)["object"]):
                                events.put(frame)
                        watcher = (collection, selector, events)
                        api.watchers.append(watcher)
                try:
                    if expired:
                        status = copy.deepcopy(EXPIRED_FRAME)
                        status["object"]["message"] = f"too old resource version: {since} ({api.rv})"
                        self._chunk(json.dumps(status).encode() + b"\n")
                        return
                    ends = time.monotonic() + float(q.get("timeoutSeconds") or 1800)
                    bookmarks = q.get("allowWatchBookmarks") == "true"
                    while time.monotonic() < ends:
                        try:
                            item = events.get(timeout=1.0)
                        except queue.Empty:
                            with api.lock:  # no event of this watch is left unsent below the bookmark's version
                                rv = api.rv if events.empty() else None
                            if bookmarks and rv is not None:
                                mark = copy.deepcopy(BOOKMARK_FRAME)
                                mark["object"]["kind"] = KINDS[collection]
                                mark["object"]["metadata"]["resourceVersion"] = str(rv)
                                self._chunk(json.dumps(mark).encode() + b"\n")
                            continue
                        if item is _END:
                            return
                        assert isinstance(item, bytes)
                        self._chunk(item)
                except (BrokenPipeError, ConnectionResetError):
                    return
                finally:
                    with api.lock:
                        if not expired:
                            api.watchers.remove(watcher)
                    try:
                        self.wfile.write(b"0\r\n\r\n")
                        self.wfile.flush()
                    except OSError:
                        pass
                    self.close_connection = True

        return Handler
