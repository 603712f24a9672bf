"""The semantic cache's embedder: one prompt embedded by an embedding model this gateway serves,
called straight at that model's deployment (aiohttp, on the loop; nothing blocks).

Direct, not through Envoy's listener: a call through the listener would come back into this very
extproc (a second ext_proc stream, authenticated with some key, metered to some tenant, and a
worker waiting on its own slots under load) for a call the gateway makes for itself. Straight at the
upstream it is one HTTP request, rendered by the same embedding adapters the embeddings flow uses
(`adapters.embeddings`), the way the warm-up and the KServe probe already reach upstreams. What it
gives up is Envoy's balancing and outlier detection for this call: endpoints are taken in turn, a
failed call moves to the next, and any failure or timeout is a cache miss, never a failed request.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import ssl

import aiohttp
import numpy as np

from adapters import embeddings
from adapters.embeddings import EmbeddingRequest
from contracts.config import Deployment, ModelConfig
from contracts.errors import ModelyardError

log = logging.getLogger("modelyard.rcache")


def _ssl(dep: Deployment) -> ssl.SSLContext | bool:
    if not dep.tls:
        return False
    ctx = ssl.create_default_context(cafile=dep.tls_ca_file)
    if dep.tls_insecure_skip_verify:
        ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE
    if dep.tls_client_cert_file and dep.tls_client_key_file:
        ctx.load_cert_chain(dep.tls_client_cert_file, dep.tls_client_key_file)
    return ctx


class Embedder:
    """Embeds one text at a time with `model` (its deployments' endpoints in turn)."""

    def __init__(self, model: ModelConfig, dimensions: int | None, timeout_s: float) -> None:
        self.model = model
        self.dimensions = dimensions
        self.timeout_s = timeout_s
        self._targets = itertools.cycle([(d, ep) for d in model.deployments for ep in d.endpoints])
        self._count = sum(len(d.endpoints) for d in model.deployments)
        self._http: aiohttp.ClientSession | None = None

    def _session(self) -> aiohttp.ClientSession:
        if self._http is None or self._http.closed:
            self._http = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=self.timeout_s))
        return self._http

    async def embed(self, text: str) -> np.ndarray | None:
        """The text's vector (float32), or None when no endpoint answered in time with one."""
        for _ in range(min(2, self._count)):  # one more endpoint when the first fails
            dep, endpoint = next(self._targets)
            req = EmbeddingRequest(self.model.name, (text,), encoding_format="base64", dimensions=self.dimensions)
            up = embeddings.render_request(dep.protocol, req, upstream_model=dep.upstream_model or self.model.name,
                                           credential=dep.credential())
            url = f"{'https' if dep.tls else 'http'}://{endpoint}{up.path}"
            try:
                async with self._session().post(url, data=up.body, ssl=_ssl(dep),
                                                headers={**up.headers, "content-type": "application/json"}) as r:
                    body = await r.read()
                    if r.status != 200:
                        log.warning("semantic cache: %s answered %d to an embedding", dep.cluster, r.status)
                        continue
                resp = embeddings.parse_response(dep.protocol, body)
            except (TimeoutError, aiohttp.ClientError, OSError, ModelyardError) as e:
                log.warning("semantic cache: embedding at %s failed (%s)", dep.cluster, type(e).__name__)
                continue
            if len(resp.vectors) == 1:
                vec: np.ndarray = np.asarray(resp.vectors[0], np.float32)
                return vec
        return None

    async def close(self) -> None:
        if self._http is not None:
            await self._http.close()
            await asyncio.sleep(0)  # aiohttp's connector closes on the next loop turn
