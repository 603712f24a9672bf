"""Asks a KServe upstream about itself (server ready, model ready, model metadata), cached briefly.

Health and metadata come from the server that would answer the inference, not from config.
The probe calls the deployment's endpoints directly, like the watermark pollers (REST with
aiohttp, gRPC with grpc.aio), so a down upstream reads as not ready instead of as an Envoy
error, and one answer per (deployment, question) serves every caller for `ttl_s`: probes and
dashboards polling the gateway do not multiply into upstream traffic. Concurrent askers of the
same question share one call.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
import time
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
import grpc
import orjson
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc as pb_grpc

from adapters import kserve, kserve_binary, kserve_meta
from contracts.config import Deployment
from contracts.errors import ModelyardError, NotFound, Unavailable, UpstreamError

log = logging.getLogger("modelyard.kserve_probe")

TTL_S = 2.0
TIMEOUT_S = 2.0
# What a server supports changes with its version, not from one second to the next.
EXTENSIONS_TTL_S = 60.0
BINARY_EXTENSION = "binary_tensor_data"


def _ssl_context(dep: Deployment) -> ssl.SSLContext | None:
    if not dep.tls:
        return None
    ctx = ssl.create_default_context(cafile=dep.tls_ca_file)
    if dep.tls_insecure_skip_verify:
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
    if dep.tls_client_cert_file and dep.tls_client_key_file:
        ctx.load_cert_chain(dep.tls_client_cert_file, dep.tls_client_key_file)
    return ctx


def _grpc_credentials(dep: Deployment) -> grpc.ChannelCredentials | None:
    if not dep.tls:
        return None

    def read(path: str | None) -> bytes | None:
        if not path:
            return None
        with open(path, "rb") as f:
            return f.read()

    return grpc.ssl_channel_credentials(read(dep.tls_ca_file), read(dep.tls_client_key_file),
                                        read(dep.tls_client_cert_file))


class KServeProbe:
    """The upstream's own answers, per deployment endpoint, kept `ttl_s` seconds."""

    def __init__(self, ttl_s: float = TTL_S, timeout_s: float = TIMEOUT_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.ttl_s = ttl_s
        self.timeout_s = timeout_s
        self.clock = clock
        self._cache: dict[tuple[str, ...], tuple[float, Any]] = {}
        self._inflight: dict[tuple[str, ...], asyncio.Future[Any]] = {}
        self._http: aiohttp.ClientSession | None = None
        self._channels: dict[tuple[str, str], grpc.aio.Channel] = {}
        self._ssl: dict[str, ssl.SSLContext | None] = {}  # by cluster: certificates are read once
        self.calls = 0  # upstream calls made (tests check the cache with it)

    # -- the three questions -----------------------------------------------------------------
    async def server_ready(self, dep: Deployment) -> bool:
        """Ready when any of the deployment's endpoints says so (Envoy balances over them)."""
        return await self._cached(("server_ready", dep.cluster), lambda: self._any_endpoint(dep, lambda ep: self._server_ready(dep, ep)))

    async def model_ready(self, dep: Deployment, model: str, version: str | None) -> bool:
        return await self._cached(("model_ready", dep.cluster, model, version or ""),
                                  lambda: self._any_endpoint(dep, lambda ep: self._model_ready(dep, ep, model, version)))

    async def model_metadata(self, dep: Deployment, model: str, version: str | None) -> dict[str, Any]:
        """The upstream's metadata (its own model name; the caller renames it)."""
        key = ("model_metadata", dep.cluster, model, version or "")
        return await self._cached(key, lambda: self._first_answer(dep, model, version))

    async def takes_binary(self, dep: Deployment) -> bool:
        """Whether a REST upstream announces the binary tensor extension in `GET /v2`
        (Triton does; MLServer 1.7 does not and answers 422 to a binary body)."""
        return await self._cached(("binary", dep.cluster), lambda: self._takes_binary(dep), EXTENSIONS_TTL_S)

    async def _takes_binary(self, dep: Deployment) -> bool:
        for ep in dep.endpoints:
            try:
                status, body = await self._get(dep, ep, "/v2")
            except ModelyardError:
                continue
            try:
                doc = orjson.loads(body) if status == 200 else {}
            except orjson.JSONDecodeError:
                doc = {}
            ext = doc.get("extensions") if isinstance(doc, dict) else None
            return isinstance(ext, list) and BINARY_EXTENSION in ext
        return False  # unknown: JSON is what every v2 server takes

    # -- cache and single flight -------------------------------------------------------------
    async def _cached(self, key: tuple[str, ...], fetch: Callable[[], Awaitable[Any]],
                      ttl_s: float | None = None) -> Any:
        hit = self._cache.get(key)
        now = self.clock()
        if hit is not None and hit[0] > now:
            return _unwrap(hit[1])
        pending = self._inflight.get(key)
        if pending is None:
            pending = asyncio.ensure_future(self._fetch(key, fetch, self.ttl_s if ttl_s is None else ttl_s))
            self._inflight[key] = pending
        return _unwrap(await asyncio.shield(pending))

    async def _fetch(self, key: tuple[str, ...], fetch: Callable[[], Awaitable[Any]], ttl_s: float) -> Any:
        try:
            try:
                value: Any = await fetch()
            except ModelyardError as e:  # remembered too: a down upstream is asked once per ttl
                value = e
            self._cache[key] = (self.clock() + ttl_s, value)
            return value
        finally:
            self._inflight.pop(key, None)

    # -- per endpoint ------------------------------------------------------------------------
    async def _any_endpoint(self, dep: Deployment, ask: Callable[[str], Awaitable[bool]]) -> bool:
        for ep in dep.endpoints:
            try:
                if await ask(ep):
                    return True
            except ModelyardError as e:
                log.info("deployment %s endpoint %s: %s", dep.cluster, ep, e.message)
        return False

    async def _first_answer(self, dep: Deployment, model: str, version: str | None) -> dict[str, Any]:
        last: ModelyardError = Unavailable(f"deployment {dep.cluster} has no endpoint")
        for ep in dep.endpoints:
            try:
                return await self._metadata(dep, ep, model, version)
            except NotFound:
                raise
            except ModelyardError as e:
                last = e
        raise last

    def _session(self) -> aiohttp.ClientSession:
        if self._http is None or self._http.closed:
            self._http = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=self.timeout_s))
        return self._http

    async def _stub(self, dep: Deployment, endpoint: str) -> pb_grpc.GRPCInferenceServiceStub:
        ch = self._channels.get((dep.cluster, endpoint))
        if ch is None:
            try:
                creds = await asyncio.to_thread(_grpc_credentials, dep)  # certificate files: off the loop
            except (OSError, ValueError) as e:
                raise UpstreamError(f"deployment {dep.cluster}: TLS files unusable ({type(e).__name__})") from None
            ch = grpc.aio.secure_channel(endpoint, creds) if creds else grpc.aio.insecure_channel(endpoint)
            self._channels[(dep.cluster, endpoint)] = ch
        return pb_grpc.GRPCInferenceServiceStub(ch)

    async def _ssl_for(self, dep: Deployment) -> ssl.SSLContext | None:
        if dep.cluster not in self._ssl:
            try:
                self._ssl[dep.cluster] = await asyncio.to_thread(_ssl_context, dep)
            except (OSError, ValueError) as e:  # ssl.SSLError is an OSError
                raise UpstreamError(f"deployment {dep.cluster}: TLS files unusable ({type(e).__name__})") from None
        return self._ssl[dep.cluster]

    async def _get(self, dep: Deployment, endpoint: str, path: str) -> tuple[int, bytes]:
        scheme = "https" if dep.tls else "http"
        self.calls += 1
        try:
            async with self._session().get(f"{scheme}://{endpoint}{path}", ssl=await self._ssl_for(dep) or True) as r:
                return r.status, await r.read()
        except (TimeoutError, aiohttp.ClientError, OSError) as e:
            raise Unavailable(f"deployment {dep.cluster} is not reachable ({type(e).__name__})") from None

    async def infer(self, dep: Deployment, endpoint: str, request: Any, timeout_s: float) -> Any:
        """One `ModelInfer` straight at an endpoint, on the probe's channel (a refused text batch's
        leader asks for its own rows: docs/batching.md); raises grpc.aio.AioRpcError as the upstream said."""
        return await (await self._stub(dep, endpoint)).ModelInfer(request, timeout=timeout_s)

    async def infer_rest(self, dep: Deployment, endpoint: str, model: str, version: str | None,
                         request: Any, timeout_s: float) -> Any:
        """One v2 REST infer straight at an endpoint (a text batch's merged call to a `kserve-rest`
        deployment: docs/batching.md); the reply as a ModelInferResponse. Raises UpstreamError for
        an HTTP error (its status kept), Unavailable when the endpoint cannot be reached."""
        binary = await self.takes_binary(dep)
        body, length = await asyncio.to_thread(kserve.infer_request_rest, request, binary=binary)
        headers = {"content-type": kserve_binary.CONTENT_TYPE if length is not None else "application/json"}
        if length is not None:
            headers[kserve_binary.HEADER] = str(length)
        scheme = "https" if dep.tls else "http"
        url = f"{scheme}://{endpoint}{kserve.rest_infer_path(model, version)}"
        try:
            async with self._session().post(url, data=body, headers=headers, ssl=await self._ssl_for(dep) or True,
                                            timeout=aiohttp.ClientTimeout(total=timeout_s)) as r:
                status, reply, reply_length = r.status, await r.read(), r.headers.get(kserve_binary.HEADER)
        except (TimeoutError, aiohttp.ClientError, OSError) as e:
            raise Unavailable(f"deployment {dep.cluster} is not reachable ({type(e).__name__})") from None
        if status != 200:
            raise UpstreamError(f"deployment {dep.cluster} answered HTTP {status}", status=status)
        return await asyncio.to_thread(kserve.parse_rest_reply, reply,
                                       int(reply_length) if reply_length and reply_length.isdigit() else None)

    async def _grpc(self, dep: Deployment, endpoint: str, method: str, request: Any) -> Any:
        self.calls += 1
        try:
            return await getattr(await self._stub(dep, endpoint), method)(request, timeout=self.timeout_s)
        except grpc.aio.AioRpcError as e:
            if e.code() == grpc.StatusCode.NOT_FOUND:
                raise NotFound(e.details() or "model not found") from None
            if e.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
                raise Unavailable(f"deployment {dep.cluster} is not reachable ({e.code().name})") from None
            raise UpstreamError(f"deployment {dep.cluster} answered {e.code().name}") from None

    async def _server_ready(self, dep: Deployment, endpoint: str) -> bool:
        if dep.protocol == "kserve-grpc":
            return bool((await self._grpc(dep, endpoint, "ServerReady", pb.ServerReadyRequest())).ready)
        status, _ = await self._get(dep, endpoint, "/v2/health/ready")
        return status == 200

    async def _model_ready(self, dep: Deployment, endpoint: str, model: str, version: str | None) -> bool:
        if dep.protocol == "kserve-grpc":
            try:
                resp = await self._grpc(dep, endpoint, "ModelReady", pb.ModelReadyRequest(name=model,
                                                                                          version=version or ""))
            except NotFound:
                return False
            return bool(resp.ready)
        status, _ = await self._get(dep, endpoint, kserve_meta.rest_model_path(model, version, "/ready"))
        return status == 200

    async def _metadata(self, dep: Deployment, endpoint: str, model: str, version: str | None) -> dict[str, Any]:
        if dep.protocol == "kserve-grpc":
            resp = await self._grpc(dep, endpoint, "ModelMetadata",
                                    pb.ModelMetadataRequest(name=model, version=version or ""))
            return kserve_meta.metadata_from_grpc(resp, model)
        status, body = await self._get(dep, endpoint, kserve_meta.rest_model_path(model, version))
        if status == 404:
            raise NotFound("the upstream does not serve this model")
        if status != 200:
            try:
                text = orjson.loads(body).get("error", "")
            except (orjson.JSONDecodeError, AttributeError):
                text = ""
            log.info("deployment %s: metadata answered HTTP %d %r", dep.cluster, status, str(text)[:200])
            raise UpstreamError(f"deployment {dep.cluster} answered HTTP {status} for model metadata")
        return kserve_meta.parse_rest_metadata(body, model)

    async def close(self) -> None:
        if self._http is not None:
            await self._http.close()
        for ch in self._channels.values():
            await ch.close()
        self._channels.clear()


def _unwrap(value: Any) -> Any:
    if isinstance(value, ModelyardError):
        raise value
    return value
