"""The demo Bedrock's batch inference, as AWS documents it: CreateModelInvocationJob (`POST
/model-invocation-job`), GetModelInvocationJob (`GET /model-invocation-job/{id}`) and
StopModelInvocationJob (`POST /model-invocation-job/{id}/stop`), each SigV4-checked like the runtime
calls. A job reads its `{recordId, modelInput}` JSONL from S3 and writes `{recordId, modelInput,
modelOutput}` records to `<output prefix><job id>/<input name>.out`, in the bucket of an
S3-compatible server (`--s3-endpoint`: moto's in the tests), signed with the demo's own keys.

Jobs are in memory; a job ends `MODELYARD_DEMO_BATCH_SECONDS` (default 2) after it was created,
later by a `demo-hold-MS` in its input, and is run when it is next read. Claude bodies only
(`anthropic_version: bedrock-2023-05-31`), answered as the demo's Messages endpoint would.
"""

from __future__ import annotations

import asyncio
import os
import secrets
import time
from collections.abc import Awaitable, Callable
from typing import Any

import orjson
from aiohttp import web

from adapters import anthropic
from contracts.errors import ModelyardError
from devstack.demo.behaviour import demo_reply
from devstack.demo.faults import hold_seconds

Refused = Callable[[web.Request], Awaitable[web.Response | None]]
ACCOUNT = "000000000000"
RUNNING = ("Submitted", "Validating", "Scheduled", "InProgress", "Stopping")


def _error(status: int, kind: str, message: str) -> web.Response:
    return web.Response(status=status, body=orjson.dumps({"message": message}), content_type="application/json",
                        headers={"x-amzn-ErrorType": kind})


def _split(uri: str) -> tuple[str, str]:
    bucket, _, key = uri.removeprefix("s3://").partition("/")
    return bucket, key


def answer_record(record: Any, model_id: str, prefix: str, n: int) -> dict[str, Any]:
    """One output record: the input's, with Claude's answer or the error it got."""
    if not isinstance(record, dict) or not isinstance(record.get("modelInput"), dict):
        return {"recordId": record.get("recordId") if isinstance(record, dict) else None,
                "error": {"errorCode": 400, "errorMessage": "modelInput is required"}}
    body = {k: v for k, v in record["modelInput"].items() if k != "anthropic_version"}
    out: dict[str, Any] = {"recordId": record.get("recordId"), "modelInput": record["modelInput"]}
    try:
        req = anthropic.parse_request(orjson.dumps({**body, "model": model_id}))
    except ModelyardError as e:
        out["error"] = {"errorCode": 400, "errorMessage": e.message}
        return out
    resp = demo_reply(req, prefix, response_id=f"msg_bdrk_batch_{n}")
    out["modelOutput"] = orjson.loads(anthropic.render_response(resp, model=model_id, request=req))
    return out


def add_job_routes(app: web.Application, refused: Refused, *, prefix: str, region: str,
                   credentials: Callable[[], Any], s3_endpoint: str | None) -> None:
    jobs: dict[str, dict[str, Any]] = {}
    seconds = float(os.environ.get("MODELYARD_DEMO_BATCH_SECONDS", "2.0"))
    clients: dict[Any, Any] = {}

    def s3() -> Any:
        import botocore.session

        creds = credentials()
        if creds not in clients:
            clients.clear()
            clients[creds] = botocore.session.get_session().create_client(
                "s3", endpoint_url=s3_endpoint, region_name=region, aws_access_key_id=creds.access_key,
                aws_secret_access_key=creds.secret_key, aws_session_token=creds.session_token)
        return clients[creds]

    def run(job: dict[str, Any]) -> None:
        """Reads the input records, answers each, writes the `.out` file (in a worker thread)."""
        client = s3()
        in_bucket, in_key = _split(job["inputDataConfig"]["s3InputDataConfig"]["s3Uri"])
        out_bucket, out_prefix = _split(job["outputDataConfig"]["s3OutputDataConfig"]["s3Uri"])
        data = client.get_object(Bucket=in_bucket, Key=in_key)["Body"].read()
        rows = []
        for n, raw in enumerate(x for x in data.splitlines() if x.strip()):
            try:
                record = orjson.loads(raw)
            except orjson.JSONDecodeError:
                record = None
            rows.append(orjson.dumps(answer_record(record, job["modelId"], prefix, n)))
        key = f"{out_prefix.rstrip('/')}/{job['_id']}/{in_key.rsplit('/', 1)[-1]}.out"
        client.put_object(Bucket=out_bucket, Key=key, Body=b"\n".join(rows) + b"\n")

    async def settle(job: dict[str, Any]) -> None:
        if job["status"] == "Stopping":
            job["status"] = "Stopped"  # stopped before it ran: no output
        elif job["status"] in RUNNING and time.time() >= job["_ends_at"]:
            try:
                await asyncio.to_thread(run, job)
                job["status"] = "Completed"
            except Exception as e:  # the bucket refused: the job failed, as Bedrock's does
                job["status"], job["message"] = "Failed", f"{type(e).__name__}"
            job["endTime"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())

    def public(job: dict[str, Any]) -> dict[str, Any]:
        return {k: v for k, v in job.items() if not k.startswith("_")}

    async def create(request: web.Request) -> web.Response:
        if (no := await refused(request)) is not None:
            return no
        try:
            doc = orjson.loads(await request.read())
            in_uri = doc["inputDataConfig"]["s3InputDataConfig"]["s3Uri"]
            out_uri = doc["outputDataConfig"]["s3OutputDataConfig"]["s3Uri"]
            assert all(isinstance(doc.get(k), str) for k in ("jobName", "roleArn", "modelId"))
            assert in_uri.startswith("s3://") and out_uri.startswith("s3://")
        except (orjson.JSONDecodeError, KeyError, TypeError, AssertionError):
            return _error(400, "ValidationException", "jobName, roleArn, modelId, inputDataConfig.s3InputDataConfig"
                          ".s3Uri and outputDataConfig.s3OutputDataConfig.s3Uri are required")
        token = doc.get("clientRequestToken")
        for job in jobs.values():  # a retried create with the same token is the same job
            if token and job["_token"] == token:
                return web.json_response({"jobArn": job["jobArn"]})
        if s3_endpoint is None:
            return _error(400, "ValidationException", "this demo was started without --s3-endpoint")
        try:  # the hold a test asks for sits in the input records
            data = await asyncio.to_thread(lambda: s3().get_object(Bucket=_split(in_uri)[0],
                                                                    Key=_split(in_uri)[1])["Body"].read())
        except Exception:
            return _error(400, "ValidationException", "the input file could not be read from S3")
        job_id = secrets.token_hex(6)
        now = time.time()
        jobs[job_id] = {
            "jobArn": f"arn:aws:bedrock:{region}:{ACCOUNT}:model-invocation-job/{job_id}",
            "jobName": doc["jobName"], "modelId": doc["modelId"], "roleArn": doc["roleArn"], "status": "InProgress",
            "submitTime": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(now)),
            "inputDataConfig": doc["inputDataConfig"], "outputDataConfig": doc["outputDataConfig"],
            "_id": job_id, "_token": token, "_ends_at": now + seconds + hold_seconds(data.decode("utf-8", "replace"))}
        return web.json_response({"jobArn": jobs[job_id]["jobArn"]})

    def find(request: web.Request) -> dict[str, Any] | None:
        return jobs.get(request.match_info["job"].rsplit("/", 1)[-1])

    async def get(request: web.Request) -> web.Response:
        if (no := await refused(request)) is not None:
            return no
        job = find(request)
        if job is None:
            return _error(404, "ResourceNotFoundException", "The specified job does not exist")
        await settle(job)
        return web.json_response(public(job))

    async def stop(request: web.Request) -> web.Response:
        if (no := await refused(request)) is not None:
            return no
        job = find(request)
        if job is None:
            return _error(404, "ResourceNotFoundException", "The specified job does not exist")
        if job["status"] not in RUNNING:
            return _error(400, "ValidationException", f"a job in status {job['status']} cannot be stopped")
        job["status"] = "Stopping"
        return web.json_response({})

    app.router.add_post("/model-invocation-job", create)
    app.router.add_get("/model-invocation-job/{job}", get)
    app.router.add_post("/model-invocation-job/{job}/stop", stop)
