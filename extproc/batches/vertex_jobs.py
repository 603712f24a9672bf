"""Vertex AI batch prediction, driven for a native batch (docs/batches.md "Vertex"): the lines go to
Cloud Storage as `<prefix><batch id>/input.jsonl` (the JSON API's media upload), then
`batchPredictionJobs.create` names it with the output prefix `gs://<bucket>/<prefix><batch id>/output`;
`get` polls it, `:cancel` cancels it, and the `predictions*.jsonl` objects of its
`outputInfo.gcsOutputDirectory` are read back once it ended.

Every request carries the deployment's Google access token (google-auth, refreshed off the event
loop); it is never logged, failures are UpstreamErrors by status only.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import quote

import aiohttp
import orjson

from adapters.cloud_targets import VertexTarget
from contracts.config import Deployment
from contracts.errors import UpstreamError
from extproc.cloud_credentials import upstream_auth

INPUT_NAME = "input.jsonl"
MAX_OUTPUT_OBJECTS = 1000  # prediction files of one job read back (Vertex writes a few per job)


def gcs_endpoint(dep: Deployment) -> str:
    assert dep.batch is not None
    return dep.batch.gcs_endpoint or "https://storage.googleapis.com"


def control_endpoint(dep: Deployment) -> str:
    """scheme://host[:port] of the job API: configured, else the deployment's own (Vertex serves
    models and jobs at one `<location>-aiplatform` host)."""
    assert dep.batch is not None
    if dep.batch.control_endpoint:
        return dep.batch.control_endpoint
    return f"{'https' if dep.tls else 'http'}://{dep.endpoints[0].removesuffix(':443')}"


def job_request(dep: Deployment, batch_id: str) -> dict[str, Any]:
    """batchPredictionJobs.create's body: the batch's input file and output prefix in the bucket."""
    b = dep.batch
    assert b is not None and b.bucket
    base = f"gs://{b.bucket}/{b.prefix}{batch_id}/"
    return {"displayName": batch_id, "model": f"publishers/google/models/{dep.upstream_model}",
            "inputConfig": {"instancesFormat": "jsonl", "gcsSource": {"uris": [base + INPUT_NAME]}},
            "outputConfig": {"predictionsFormat": "jsonl", "gcsDestination": {"outputUriPrefix": base + "output"}},
            "labels": {"modelyard_batch": batch_id.replace("_", "-").lower()[:63]}}


def output_prefix(dep: Deployment, job: dict[str, Any]) -> str | None:
    """The object prefix of the job's predictions, when it lies under the deployment's bucket and prefix."""
    b = dep.batch
    assert b is not None
    uri = (job.get("outputInfo") or {}).get("gcsOutputDirectory")
    bucket_base = f"gs://{b.bucket}/{b.prefix}"
    if not isinstance(uri, str) or not uri.startswith(bucket_base) or ".." in uri:
        return None  # not where the gateway asked: read nothing from elsewhere
    return uri[len(f"gs://{b.bucket}/"):].rstrip("/") + "/"


def job_path(name: str) -> str:
    """The job's resource name as a path: `projects/../locations/../batchPredictionJobs/<id>`."""
    return "/v1/" + quote(name, safe="/-_.~")


class VertexJobs:
    def __init__(self, timeout: aiohttp.ClientTimeout) -> None:
        self._timeout = timeout
        self._session: aiohttp.ClientSession | None = None

    async def _call(self, dep: Deployment, method: str, url: str, body: bytes | None = None,
                    content_type: str = "application/json") -> tuple[int, bytes, VertexTarget]:
        auth = await upstream_auth(dep)
        if not isinstance(auth.cloud, VertexTarget) or not auth.credential:
            raise UpstreamError(f"{dep.cluster}: no Google access token for its batch jobs")
        headers = {"authorization": "Bearer " + auth.credential}
        if body is not None:
            headers["content-type"] = content_type
        if self._session is None:
            self._session = aiohttp.ClientSession(timeout=self._timeout, auto_decompress=False)
        try:
            async with self._session.request(method, url, data=body, headers=headers) as r:
                return r.status, await r.read(), auth.cloud
        except (aiohttp.ClientError, TimeoutError) as e:
            raise UpstreamError(f"{dep.cluster}: {method} to Vertex or Cloud Storage: {type(e).__name__}") from None

    async def _json(self, dep: Deployment, method: str, url: str, doc: Any = None) -> dict[str, Any]:
        status, raw, _ = await self._call(dep, method, url, orjson.dumps(doc) if doc is not None else None)
        if not 200 <= status < 300:
            raise UpstreamError(f"{dep.cluster}: {method} {url.split('?')[0].rsplit('/', 1)[-1]} answered {status}")
        try:
            out = orjson.loads(raw) if raw else {}
        except orjson.JSONDecodeError:
            out = None
        if not isinstance(out, dict):
            raise UpstreamError(f"{dep.cluster}: Vertex answered something other than a JSON object")
        return out

    def _object_url(self, dep: Deployment, name: str) -> str:
        assert dep.batch is not None
        return f"{gcs_endpoint(dep)}/storage/v1/b/{dep.batch.bucket}/o/{quote(name, safe='')}?alt=media"

    async def submit(self, dep: Deployment, payload: bytes, batch_id: str) -> str:
        """The job's resource name, once its input is in the bucket and the job was created."""
        b = dep.batch
        assert b is not None
        name = quote(f"{b.prefix}{batch_id}/{INPUT_NAME}", safe="")
        status, _, target = await self._call(
            dep, "POST", f"{gcs_endpoint(dep)}/upload/storage/v1/b/{b.bucket}/o?uploadType=media&name={name}",
            payload, "application/jsonl")
        if status != 200:
            raise UpstreamError(f"{dep.cluster}: the Cloud Storage upload of the batch input answered {status}")
        parent = f"projects/{quote(target.project, safe='')}/locations/{quote(target.location, safe='')}"
        doc = await self._json(dep, "POST", f"{control_endpoint(dep)}/v1/{parent}/batchPredictionJobs",
                               job_request(dep, batch_id))
        job = doc.get("name")
        if not isinstance(job, str) or not job.startswith(parent + "/batchPredictionJobs/"):
            raise UpstreamError("Vertex's batchPredictionJobs.create gave no job name")
        return job

    async def status(self, dep: Deployment, upstream: str) -> dict[str, Any]:
        return await self._json(dep, "GET", control_endpoint(dep) + job_path(upstream))

    async def cancel(self, dep: Deployment, upstream: str) -> None:
        await self._json(dep, "POST", control_endpoint(dep) + job_path(upstream) + ":cancel", {})

    async def results(self, dep: Deployment, job: dict[str, Any]) -> bytes:
        """Every predictions file of the job, concatenated; none when it wrote none."""
        b = dep.batch
        assert b is not None
        prefix = output_prefix(dep, job)
        if prefix is None:
            return b""
        listing = await self._json(dep, "GET", f"{gcs_endpoint(dep)}/storage/v1/b/{b.bucket}/o?prefix="
                                   f"{quote(prefix, safe='')}&maxResults={MAX_OUTPUT_OBJECTS}")
        names = sorted(i["name"] for i in listing.get("items") or [] if isinstance(i, dict)
                       and isinstance(i.get("name"), str) and i["name"].rsplit("/", 1)[-1].startswith("predictions")
                       and i["name"].endswith(".jsonl"))
        out = []
        for name in names:
            status, raw, _ = await self._call(dep, "GET", self._object_url(dep, name))
            if status != 200:
                raise UpstreamError(f"{dep.cluster}: the Cloud Storage read of a predictions file answered {status}")
            out.append(raw if raw.endswith(b"\n") else raw + b"\n")
        return b"".join(out)

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
