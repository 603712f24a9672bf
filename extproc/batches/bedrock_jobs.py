"""Bedrock batch inference, driven for a native batch (docs/batches.md "Bedrock"): the records go to
S3 as `<prefix><batch id>/input.jsonl`, then CreateModelInvocationJob names it with the output
prefix `<prefix><batch id>/output/`; GetModelInvocationJob polls it, StopModelInvocationJob cancels
it, and the job's `<output>/<job id>/input.jsonl.out` is read back once it ended.

Every request is SigV4-signed with the deployment's AWS credentials (the botocore chain the
Bedrock runtime calls use): S3 with botocore's S3 signer, the control plane as `bedrock`. Signing
hashes the body, so it runs in a worker thread; credentials are never logged, failures are
UpstreamErrors by status and the AWS error type only.
"""

from __future__ import annotations

import asyncio
from typing import Any
from urllib.parse import quote, urlsplit

import aiohttp
import orjson

from adapters.bedrock.signing import sign
from adapters.cloud_targets import BedrockTarget
from contracts.config import Deployment
from contracts.errors import UpstreamError
from extproc.batches.s3_blobs import signed_headers
from extproc.cloud_credentials import upstream_auth

INPUT_NAME = "input.jsonl"


def control_endpoint(dep: Deployment) -> str:
    """scheme://host[:port] of Bedrock's control plane: configured, else the runtime's endpoint
    with `bedrock-runtime.` as `bedrock.` (AWS's two hosts per region)."""
    assert dep.batch is not None
    if dep.batch.control_endpoint:
        return dep.batch.control_endpoint
    host = dep.endpoints[0].replace("bedrock-runtime.", "bedrock.", 1)
    return f"{'https' if dep.tls else 'http'}://{host.removesuffix(':443')}"


def s3_endpoint(dep: Deployment) -> str:
    assert dep.batch is not None and dep.bedrock is not None
    return dep.batch.s3_endpoint or f"https://s3.{dep.bedrock.region}.amazonaws.com"


def job_id(job_arn: str) -> str:
    """The job's id, the ARN's last segment: GetModelInvocationJob takes it in the path unescaped."""
    return job_arn.rsplit("/", 1)[-1]


def job_name(batch_id: str) -> str:
    return batch_id.replace("_", "-")[:63]  # Bedrock's jobName: letters, digits, hyphens


def job_request(dep: Deployment, batch_id: str) -> dict[str, Any]:
    """CreateModelInvocationJob's body: the batch's input file and output prefix in the bucket."""
    b = dep.batch
    assert b is not None and b.bucket and b.role_arn
    base = f"s3://{b.bucket}/{b.prefix}{batch_id}/"
    return {"jobName": job_name(batch_id), "roleArn": b.role_arn, "modelId": dep.upstream_model,
            "clientRequestToken": batch_id,  # a retried create is the same job, not a second one
            "inputDataConfig": {"s3InputDataConfig": {"s3Uri": base + INPUT_NAME, "s3InputFormat": "JSONL"}},
            "outputDataConfig": {"s3OutputDataConfig": {"s3Uri": base + "output/"}}}


def output_key(dep: Deployment, job: dict[str, Any], upstream: str) -> str | None:
    """The key of the job's results in the deployment's bucket, from the output prefix the job names."""
    b = dep.batch
    assert b is not None
    uri = ((job.get("outputDataConfig") or {}).get("s3OutputDataConfig") or {}).get("s3Uri")
    bucket_base = f"s3://{b.bucket}/{b.prefix}"
    if not isinstance(uri, str) or not uri.startswith(bucket_base):
        return None  # not the prefix the gateway wrote: read nothing from elsewhere
    return f"{uri[len(f's3://{b.bucket}/'):].rstrip('/')}/{job_id(upstream)}/{INPUT_NAME}.out"


class BedrockJobs:
    def __init__(self, timeout: aiohttp.ClientTimeout) -> None:
        self._timeout = timeout
        self._session: aiohttp.ClientSession | None = None

    def _http(self) -> aiohttp.ClientSession:
        if self._session is None:
            self._session = aiohttp.ClientSession(timeout=self._timeout, auto_decompress=False)
        return self._session

    @staticmethod
    async def _target(dep: Deployment) -> BedrockTarget:
        auth = await upstream_auth(dep)
        if not isinstance(auth.cloud, BedrockTarget) or auth.cloud.credentials is None:
            raise UpstreamError(f"{dep.cluster}: no AWS credentials for its batch jobs")
        return auth.cloud

    async def _send(self, method: str, url: str, headers: dict[str, str], body: bytes, what: str) -> tuple[int, bytes]:
        try:
            async with self._http().request(method, url, data=body or None, headers=headers,
                                            skip_auto_headers=("content-type",)) as r:
                return r.status, await r.read()
        except (aiohttp.ClientError, TimeoutError) as e:
            raise UpstreamError(f"{what}: {type(e).__name__}") from None

    async def _s3(self, dep: Deployment, method: str, key: str, body: bytes = b"") -> tuple[int, bytes]:
        assert dep.batch is not None
        target = await self._target(dep)
        url = f"{s3_endpoint(dep)}/{dep.batch.bucket}/{quote(key, safe='/-_.~')}"
        creds = target.credentials
        assert creds is not None
        headers = await asyncio.to_thread(signed_headers, method, url, body, target.region, creds)
        return await self._send(method, url, headers, body, f"{dep.cluster}: S3 {method}")

    async def _control(self, dep: Deployment, method: str, path: str, doc: Any = None) -> dict[str, Any]:
        target = await self._target(dep)
        base = control_endpoint(dep)
        host = urlsplit(base).netloc
        body = orjson.dumps(doc) if doc is not None else b""
        headers = {"content-type": "application/json"} if doc is not None else {}
        creds = target.credentials
        assert creds is not None
        headers.update(await asyncio.to_thread(sign, host, path, body, headers, target.region, creds, method))
        status, raw = await self._send(method, base + path, headers, body, f"{dep.cluster}: {method} {path}")
        if not 200 <= status < 300:
            try:
                kind = orjson.loads(raw).get("__type") or ""
            except (orjson.JSONDecodeError, AttributeError):
                kind = ""
            raise UpstreamError(f"{dep.cluster}: {method} {path} answered {status} {str(kind)[:64]}")
        try:
            out = orjson.loads(raw) if raw else {}
        except orjson.JSONDecodeError:
            out = None
        if not isinstance(out, dict):
            raise UpstreamError(f"{dep.cluster}: Bedrock's job API answered something other than a JSON object")
        return out

    async def submit(self, dep: Deployment, payload: bytes, batch_id: str) -> str:
        """The job's ARN, once its input is in the bucket and the job was created."""
        assert dep.batch is not None
        status, body = await self._s3(dep, "PUT", f"{dep.batch.prefix}{batch_id}/{INPUT_NAME}", payload)
        if status != 200:
            raise UpstreamError(f"{dep.cluster}: S3 PUT of the batch input answered {status}")
        doc = await self._control(dep, "POST", "/model-invocation-job", job_request(dep, batch_id))
        arn = doc.get("jobArn")
        if not isinstance(arn, str) or not arn:
            raise UpstreamError("Bedrock's CreateModelInvocationJob gave no jobArn")
        return arn

    async def status(self, dep: Deployment, upstream: str) -> dict[str, Any]:
        return await self._control(dep, "GET", f"/model-invocation-job/{job_id(upstream)}")

    async def cancel(self, dep: Deployment, upstream: str) -> None:
        await self._control(dep, "POST", f"/model-invocation-job/{job_id(upstream)}/stop")

    async def results(self, dep: Deployment, upstream: str, job: dict[str, Any]) -> bytes:
        """The job's output records; none when it wrote no output (failed, or stopped before any ran)."""
        key = output_key(dep, job, upstream)
        if key is None:
            return b""
        status, body = await self._s3(dep, "GET", key)
        if status == 404:
            return b""
        if status != 200:
            raise UpstreamError(f"{dep.cluster}: S3 GET of the job's output answered {status}")
        return body

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
