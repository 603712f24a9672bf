"""The endpoint picker's view of the cluster, from the Kubernetes API (aiohttp, in the background):
a list+watch of the InferencePool named in config (by `fieldSelector=metadata.name=`), of the pods
its selector names (listed again when the selector changes) and of the InferenceObjectives in its
namespace. Each change hands the pool's ready endpoints, or the
objectives' priorities, to the server (which re-points the replica board). The protocol's state
is the sans-I/O `watch.Collection`; what counts as a replica is `cluster.py`.

Access: the in-cluster service account (token re-read each request, as the kubelet rotates it;
its CA; its namespace; $KUBERNETES_SERVICE_HOST/PORT), or a kubeconfig's current context, or a
plain `api_server` URL (a local stand-in). A failed list or watch is retried with exponential
backoff (0.5 s doubling to `backoff_max_s`); the last known members stay in force meanwhile.
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import os
import random
import ssl
from collections.abc import Callable, Coroutine, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import yaml

from contracts.config.endpoint_picker import KubernetesSource
from contracts.errors import ConfigError
from extproc.epp import cluster
from extproc.epp.watch import Collection, Expired, WatchFailed, status_error
from extproc.shutdown import stop_polling

log = logging.getLogger(__name__)

SERVICE_ACCOUNT = Path("/var/run/secrets/kubernetes.io/serviceaccount")


class AccessError(ValueError):
    """No way to reach the API (not in a pod, and no kubeconfig or api_server given)."""


@dataclass(frozen=True)
class Access:
    server: str
    namespace: str
    token: str | None = None
    token_file: str | None = None
    ca_file: str | None = None
    ca_data: str | None = None
    cert_file: str | None = None
    key_file: str | None = None
    insecure: bool = False

    def headers(self) -> dict[str, str]:
        token = self.token
        if self.token_file:
            token = Path(self.token_file).read_text().strip()  # projected tokens rotate: read each time
        return {"Authorization": f"Bearer {token}"} if token else {}

    def ssl_context(self) -> ssl.SSLContext | bool:
        if not self.server.startswith("https:"):
            return False
        if self.insecure:
            ctx = ssl.create_default_context()
            ctx.check_hostname = False
            ctx.verify_mode = ssl.CERT_NONE
            return ctx
        ctx = ssl.create_default_context(cafile=self.ca_file, cadata=self.ca_data)
        if self.cert_file and self.key_file:
            ctx.load_cert_chain(self.cert_file, self.key_file)
        return ctx


def kubeconfig_access(doc: Mapping[str, Any], base: Path, namespace: str | None) -> Access:
    """A kubeconfig's current context; relative file paths are relative to the kubeconfig."""
    def named(section: str, name: str | None) -> Mapping[str, Any]:
        for entry in doc.get(section) or []:
            if entry.get("name") == name:
                return entry.get(section[:-1]) or {}
        raise AccessError(f"kubeconfig: no {section[:-1]} {name!r}")

    def path(p: str | None) -> str | None:
        return None if p is None else str(base / p)

    ctx = named("contexts", doc.get("current-context"))
    cl, user = named("clusters", ctx.get("cluster")), named("users", ctx.get("user")) if ctx.get("user") else {}
    if not cl.get("server"):
        raise AccessError("kubeconfig: the cluster has no server")
    ca_data = cl.get("certificate-authority-data")
    return Access(server=str(cl["server"]).rstrip("/"), namespace=namespace or ctx.get("namespace") or "default",
                  token=user.get("token"), token_file=path(user.get("tokenFile")),
                  ca_file=path(cl.get("certificate-authority")),
                  ca_data=base64.b64decode(ca_data).decode() if ca_data else None,
                  cert_file=path(user.get("client-certificate")), key_file=path(user.get("client-key")),
                  insecure=bool(cl.get("insecure-skip-tls-verify")))


def resolve_access(src: KubernetesSource, environ: Mapping[str, str] = os.environ,
                   account: Path = SERVICE_ACCOUNT) -> Access:
    """The config's api_server, else its kubeconfig, else the pod's service account, else $KUBECONFIG
    (its first file), as client-go's order goes."""
    if src.api_server:
        return Access(server=src.api_server.rstrip("/"), namespace=src.namespace or "default")
    host, port = environ.get("KUBERNETES_SERVICE_HOST"), environ.get("KUBERNETES_SERVICE_PORT", "443")
    kubeconfig = src.kubeconfig
    if kubeconfig is None and (not host or not (account / "token").exists()):
        kubeconfig = (environ.get("KUBECONFIG") or "").split(os.pathsep)[0] or None
        if kubeconfig is None:
            raise AccessError("not in a pod (no $KUBERNETES_SERVICE_HOST or service account token) and no "
                              "$KUBECONFIG: set endpoint_picker.kubernetes.kubeconfig or api_server")
    if kubeconfig:
        try:
            doc = yaml.safe_load(Path(kubeconfig).read_text())
        except (OSError, yaml.YAMLError) as e:
            raise AccessError(f"kubeconfig {kubeconfig}: {e}") from None
        if not isinstance(doc, dict):
            raise AccessError(f"kubeconfig {kubeconfig}: not a mapping")
        return kubeconfig_access(doc, Path(kubeconfig).parent, src.namespace)
    assert host is not None
    ns = src.namespace
    if ns is None:
        try:
            ns = (account / "namespace").read_text().strip()
        except OSError:
            ns = "default"
    host = f"[{host}]" if ":" in host else host
    return Access(server=f"https://{host}:{port}", namespace=ns, token_file=str(account / "token"),
                  ca_file=str(account / "ca.crt"))


class Backoff:
    def __init__(self, first_s: float = 0.5, max_s: float = 30.0) -> None:
        self.first_s, self.max_s, self.next_s = first_s, max_s, first_s

    def reset(self) -> None:
        self.next_s = self.first_s

    def take(self) -> float:
        delay, self.next_s = self.next_s, min(self.next_s * 2, self.max_s)
        return delay * random.uniform(0.8, 1.0)  # jitter: many pickers do not reconnect in step


def api_path(api_version: str, namespace: str, plural: str) -> str:
    root = "/api/v1" if api_version == "v1" else f"/apis/{api_version}"
    return f"{root}/namespaces/{namespace}/{plural}"


class ClusterSource:
    """Background tasks keeping `on_members` and `on_objectives` current from the API."""

    def __init__(self, src: KubernetesSource, pool: str, on_members: Callable[[list[str]], None],
                 on_objectives: Callable[[dict[str, int]], None], access: Access | None = None) -> None:
        self.src, self.pool_name = src, pool
        try:
            self.access = access or resolve_access(src)
        except AccessError as e:
            raise ConfigError(f"endpoint_picker.kubernetes: {e}") from None
        self.on_members, self.on_objectives = on_members, on_objectives
        self.pools, self.pods, self.objectives = Collection(), Collection(), Collection()
        self.pool: cluster.PoolSpec | None = None
        self._pool_known = asyncio.Event()
        self.members: list[str] | None = None
        self.synced = asyncio.Event()  # the first pod list is in
        self._session: aiohttp.ClientSession | None = None
        self._tasks: dict[str, asyncio.Task[None]] = {}

    # -- HTTP -------------------------------------------------------------------------------
    async def _get(self, path: str, params: Mapping[str, str] | None = None) -> Any:
        assert self._session is not None
        async with self._session.get(self.access.server + path, params=params, headers=self.access.headers(),
                                     ssl=self.access.ssl_context(),
                                     timeout=aiohttp.ClientTimeout(total=30)) as resp:
            body = await resp.json(content_type=None)
            if resp.status != 200:
                raise status_error(body) if isinstance(body, dict) and body.get("kind") == "Status" else \
                    WatchFailed(f"HTTP {resp.status} from {path}")
            return body

    async def _watch(self, path: str, params: Mapping[str, str], coll: Collection, changed: Callable[[], None],
                     backoff: Backoff) -> None:
        """One watch connection from `coll.resource_version`, until the server ends it."""
        assert self._session is not None and coll.resource_version is not None
        q = {**params, "watch": "1", "resourceVersion": coll.resource_version, "allowWatchBookmarks": "true",
             "timeoutSeconds": str(self.src.watch_timeout_s)}
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=10, sock_read=self.src.watch_timeout_s + 30)
        async with self._session.get(self.access.server + path, params=q, headers=self.access.headers(),
                                     ssl=self.access.ssl_context(), timeout=timeout) as resp:
            if resp.status != 200:
                try:
                    body = json.loads(await resp.read())
                except ValueError:
                    body = None
                raise status_error(body) if isinstance(body, dict) else WatchFailed(f"HTTP {resp.status} watching {path}")
            coll.start_watch()
            async for chunk in resp.content.iter_any():
                backoff.reset()  # the server answers: a later failure starts from the shortest wait
                if coll.feed(chunk):
                    changed()

    async def _list_watch(self, what: str, path: Callable[[], str], params: Callable[[], dict[str, str]],
                          coll: Collection, changed: Callable[[], None], before_list: Callable[[], Any]) -> None:
        backoff = Backoff(max_s=self.src.backoff_max_s)
        while True:
            listed = False
            try:
                if coll.resource_version is None:
                    await before_list()
                    coll.replace(await self._get(path(), params()))
                    listed = True
                    changed()
                    log.info("kubernetes: listed %s (%d) at resourceVersion %s", what, len(coll.items),
                             coll.resource_version)
                began = asyncio.get_running_loop().time()
                await self._watch(path(), params(), coll, changed, backoff)
                # The server ended the watch (its timeout): resume from the last version seen; one
                # that ends at once, again and again (a proxy's idle cut), is not a hot loop.
                if asyncio.get_running_loop().time() - began < 1.0:
                    await asyncio.sleep(backoff.take())
            except Expired as e:
                log.info("kubernetes: %s watch expired (%s): listing again", what, e)
                coll.expire()
                if listed:  # expired at once from a fresh list: a server in trouble, not a relist loop
                    await asyncio.sleep(backoff.take())
            except (aiohttp.ClientError, OSError, TimeoutError, WatchFailed, cluster.PoolError, ValueError) as e:
                delay = backoff.take()
                log.warning("kubernetes: %s: %s: %s (retrying in %.1fs)", what, type(e).__name__, e, delay)
                await asyncio.sleep(delay)

    # -- the pool, its pods and objectives ---------------------------------------------------
    def _pool_changed(self) -> None:
        """The InferencePool's watch: a new selector lists the pods again; new ports re-point at once."""
        obj = self.pools.items.get(f"{self.access.namespace}/{self.pool_name}")
        if obj is None:
            log.warning("kubernetes: InferencePool %s/%s not found (keeping %s)", self.access.namespace,
                        self.pool_name, "its last pods" if self.pool else "no pods")
            return
        try:
            spec = cluster.read_pool(obj)
        except cluster.PoolError as e:
            log.warning("kubernetes: InferencePool %s/%s: %s (keeping the last)", self.access.namespace,
                        self.pool_name, e)
            return
        old, self.pool = self.pool, spec
        if spec == old:
            return
        log.info("kubernetes: InferencePool %s/%s selects %s, ports %s", self.access.namespace,
                 self.pool_name, spec.label_selector(), ",".join(map(str, spec.ports)))
        self._pool_known.set()
        if old is None:
            return  # the pod watch starts on it
        if old.selector != spec.selector:  # other pods: a new list with the new labelSelector
            self._restart_pods()
        elif self.pods.resource_version is not None:
            self._pods_changed()

    def _pods_changed(self) -> None:
        assert self.pool is not None
        members = cluster.pool_endpoints(self.pods.items.values(), self.pool)
        self.synced.set()
        if members != self.members:
            self.members = members
            self.on_members(members)

    def _objectives_changed(self) -> None:
        self.on_objectives(cluster.objective_priorities(self.objectives.items.values(), self.pool_name))

    async def _nothing(self) -> None:
        return None

    async def _pool_read(self) -> None:
        await self._pool_known.wait()

    def _start_task(self, name: str, coro: Coroutine[Any, Any, None]) -> None:
        self._tasks[name] = asyncio.create_task(coro, name=f"epp:{name}")

    def _watch_pods(self) -> Coroutine[Any, Any, None]:
        return self._list_watch("pods", lambda: api_path("v1", self.access.namespace, "pods"),
                                lambda: {"labelSelector": self.pool.label_selector()} if self.pool else {},
                                self.pods, self._pods_changed, self._pool_read)

    def _restart_pods(self) -> None:
        task = self._tasks.pop("pods", None)
        if task is not None:
            task.cancel()
        self.pods.expire()
        self._start_task("pods", self._watch_pods())

    async def start(self) -> None:
        self._session = aiohttp.ClientSession()
        ns = self.access.namespace
        pools = api_path(self.src.pool_api, ns, "inferencepools")
        self._start_task("inferencepools", self._list_watch(
            "inferencepools", lambda: pools, lambda: {"fieldSelector": f"metadata.name={self.pool_name}"},
            self.pools, self._pool_changed, self._nothing))
        self._start_task("pods", self._watch_pods())
        if self.src.objectives_api:
            objectives = api_path(self.src.objectives_api, ns, "inferenceobjectives")
            self._start_task("inferenceobjectives", self._list_watch(
                "inferenceobjectives", lambda: objectives, dict, self.objectives, self._objectives_changed,
                self._nothing))

    async def stop(self) -> None:
        await stop_polling(self._tasks.values(), self._session)
        self._tasks, self._session = {}, None
