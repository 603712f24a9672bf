"""The provider's own batch API, over aiohttp (docs/batches.md "Native batches"): OpenAI's Files +
Batches (upload the input, create, retrieve, cancel, download the output and error files) and
Anthropic's Message Batches (create, retrieve, cancel, results). Straight to the deployment's
endpoint, with its credential in the provider's header; the credential is never logged, and a
failure is an UpstreamError the poller logs and retries on its next pass.
"""

from __future__ import annotations

import ssl
from typing import Any

import aiohttp
import orjson

from contracts.config import Deployment
from contracts.errors import UpstreamError
from extproc.batches.bedrock_jobs import BedrockJobs
from extproc.batches.native import ANTHROPIC_VERSION, OPENAI_PATH, Protocol
from extproc.batches.vertex_jobs import VertexJobs
from extproc.cloud_credentials import upstream_auth


def _ssl(dep: Deployment) -> ssl.SSLContext | bool:
    if not dep.tls:
        return False
    ctx = ssl.create_default_context(cafile=dep.tls_ca_file)
    if dep.tls_client_cert_file and dep.tls_client_key_file:
        ctx.load_cert_chain(dep.tls_client_cert_file, dep.tls_client_key_file)
    if dep.tls_insecure_skip_verify:
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
    return ctx


class NativeClient:
    def __init__(self, timeout_s: float = 60.0) -> None:
        self._timeout = aiohttp.ClientTimeout(total=timeout_s)
        self._session: aiohttp.ClientSession | None = None
        self.bedrock = BedrockJobs(self._timeout)  # Bedrock's jobs read and write S3: their own client
        self.vertex = VertexJobs(self._timeout)  # Vertex's read and write Cloud Storage

    async def _call(self, dep: Deployment, protocol: Protocol, method: str, path: str, *,
                    json_body: Any = None, form: aiohttp.FormData | None = None) -> bytes:
        auth = await upstream_auth(dep)
        headers: dict[str, str] = {}
        if protocol == "anthropic":
            headers["anthropic-version"] = ANTHROPIC_VERSION
            if auth.credential:
                headers["x-api-key"] = auth.credential
        elif auth.credential:
            headers["authorization"] = "Bearer " + auth.credential
        data: Any = form
        if json_body is not None:
            headers["content-type"] = "application/json"
            data = orjson.dumps(json_body)
        if self._session is None:
            self._session = aiohttp.ClientSession(timeout=self._timeout)
        url = f"{'https' if dep.tls else 'http'}://{dep.endpoints[0]}{path}"
        try:
            async with self._session.request(method, url, data=data, headers=headers, ssl=_ssl(dep)) as r:
                body = await r.read()
                if not 200 <= r.status < 300:
                    raise UpstreamError(f"{dep.cluster}: {method} {path} answered {r.status}")
                return body
        except (aiohttp.ClientError, TimeoutError) as e:
            raise UpstreamError(f"{dep.cluster}: {method} {path}: {type(e).__name__}") from None

    async def _json(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
        body = await self._call(*args, **kwargs)
        try:
            doc = orjson.loads(body)
        except orjson.JSONDecodeError:
            doc = None
        if not isinstance(doc, dict):
            raise UpstreamError("the provider's batch API answered something other than a JSON object")
        return doc

    async def submit(self, dep: Deployment, protocol: Protocol, payload: bytes | dict[str, Any],
                     batch_id: str) -> str:
        """The provider's batch id for a new batch of `payload` (OpenAI's input JSONL, Anthropic's
        requests, Bedrock's records: the job's ARN)."""
        if protocol == "bedrock":
            assert isinstance(payload, bytes)
            return await self.bedrock.submit(dep, payload, batch_id)
        if protocol == "vertex":
            assert isinstance(payload, bytes)
            return await self.vertex.submit(dep, payload, batch_id)
        if protocol == "anthropic":
            doc = await self._json(dep, protocol, "POST", "/v1/messages/batches", json_body=payload)
        else:
            assert isinstance(payload, bytes)
            form = aiohttp.FormData()
            form.add_field("purpose", "batch")
            form.add_field("file", payload, filename=f"{batch_id}.jsonl", content_type="application/jsonl")
            f = await self._json(dep, protocol, "POST", "/v1/files", form=form)
            doc = await self._json(dep, protocol, "POST", "/v1/batches", json_body={
                "input_file_id": f.get("id"), "endpoint": OPENAI_PATH, "completion_window": "24h",
                "metadata": {"modelyard_batch": batch_id}})
        upstream = doc.get("id")
        if not isinstance(upstream, str) or not upstream:
            raise UpstreamError("the provider's batch API gave no batch id")
        return upstream

    async def status(self, dep: Deployment, protocol: Protocol, upstream: str) -> dict[str, Any]:
        if protocol == "bedrock":
            return await self.bedrock.status(dep, upstream)
        if protocol == "vertex":
            return await self.vertex.status(dep, upstream)
        path = f"/v1/messages/batches/{upstream}" if protocol == "anthropic" else f"/v1/batches/{upstream}"
        return await self._json(dep, protocol, "GET", path)

    async def cancel(self, dep: Deployment, protocol: Protocol, upstream: str) -> None:
        if protocol == "bedrock":
            return await self.bedrock.cancel(dep, upstream)
        if protocol == "vertex":
            return await self.vertex.cancel(dep, upstream)
        path = f"/v1/messages/batches/{upstream}/cancel" if protocol == "anthropic" \
            else f"/v1/batches/{upstream}/cancel"
        await self._call(dep, protocol, "POST", path)

    async def results(self, dep: Deployment, protocol: Protocol, upstream: str,
                      doc: dict[str, Any]) -> tuple[bytes, bytes]:
        """(OpenAI's output file, its error file), (Anthropic's results JSONL, b"") or (Bedrock's
        `.jsonl.out` records, b"")."""
        if protocol == "bedrock":
            return await self.bedrock.results(dep, upstream, doc), b""
        if protocol == "vertex":
            return await self.vertex.results(dep, doc), b""
        if protocol == "anthropic":
            return await self._call(dep, protocol, "GET", f"/v1/messages/batches/{upstream}/results"), b""
        out = err = b""
        if isinstance(doc.get("output_file_id"), str):
            out = await self._call(dep, protocol, "GET", f"/v1/files/{doc['output_file_id']}/content")
        if isinstance(doc.get("error_file_id"), str):
            err = await self._call(dep, protocol, "GET", f"/v1/files/{doc['error_file_id']}/content")
        return out, err

    async def close(self) -> None:
        await self.bedrock.close()
        await self.vertex.close()
        if self._session is not None:
            await self._session.close()
