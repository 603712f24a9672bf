"""The demo Vertex AI's batch prediction and a stand-in for Cloud Storage, both behind its OAuth2
tokens: the Cloud Storage JSON API's media upload (`POST /upload/storage/v1/b/{bucket}/o?uploadType=
media&name=`), object read (`GET /storage/v1/b/{bucket}/o/{name}?alt=media`) and list (`GET
/storage/v1/b/{bucket}/o?prefix=`), in memory; and `batchPredictionJobs` create, get and `:cancel`
(Gemini models), a job reading its `{"request": ...}` JSONL from that store and writing
`{"request", "response", "status"}` lines to `<outputUriPrefix>/prediction-model-<time>/predictions.jsonl`.

This is not Google's Cloud Storage: no emulator of it installs from the registries reachable here,
so the demo serves the few JSON API calls the gateway makes, as Google documents them. A job ends
`MODELYARD_DEMO_BATCH_SECONDS` (default 2) after it was created, later by a `demo-hold-MS` in its
input, and is run when it is next read; Gemini bodies are answered as the demo's generateContent.
"""

from __future__ import annotations

import os
import secrets
import time
from collections.abc import Callable
from typing import Any
from urllib.parse import unquote

import orjson
from aiohttp import web

from adapters import gemini
from contracts.errors import ModelyardError
from devstack.demo.behaviour import demo_reply
from devstack.demo.faults import hold_seconds

Refused = Callable[[web.Request], web.Response | None]
ENDED = ("JOB_STATE_SUCCEEDED", "JOB_STATE_FAILED", "JOB_STATE_CANCELLED")


def _error(status: int, message: str, st: str) -> web.Response:
    return web.Response(status=status, body=orjson.dumps({"error": {"code": status, "message": message, "status": st}}),
                        content_type="application/json")


def _split(uri: str) -> tuple[str, str]:
    bucket, _, name = uri.removeprefix("gs://").partition("/")
    return bucket, name


def predict_line(raw: bytes, model: str, prefix: str, n: int) -> dict[str, Any]:
    """One output line: the request as given, with Gemini's answer or why it failed."""
    try:
        line = orjson.loads(raw)
        request = line["request"]
        assert isinstance(request, dict)
    except (orjson.JSONDecodeError, KeyError, TypeError, AssertionError):
        return {"request": None, "status": "Invalid JSON line: each needs a `request` object"}
    body = {k: v for k, v in request.items() if k != "labels"}
    try:
        req = gemini.parse_request(orjson.dumps(body), path_model=model)
    except ModelyardError as e:
        return {"request": request, "status": e.message}
    resp = demo_reply(req, prefix, response_id=f"vertex-batch-{n}")
    return {"request": request, "response": orjson.loads(gemini.render_response(resp, model=model, request=req)),
            "status": ""}


def add_job_routes(app: web.Application, refused: Refused, *, prefix: str, project: str, location: str) -> None:
    objects: dict[tuple[str, str], bytes] = {}
    jobs: dict[str, dict[str, Any]] = {}
    seconds = float(os.environ.get("MODELYARD_DEMO_BATCH_SECONDS", "2.0"))

    # -- Cloud Storage's JSON API, the calls the gateway makes ------------------------------------
    async def upload(request: web.Request) -> web.Response:
        if (no := refused(request)) is not None:
            return no
        name = request.query.get("name")
        if request.query.get("uploadType") != "media" or not name:
            return _error(400, "uploadType=media and name are required", "INVALID_ARGUMENT")
        data = await request.read()
        objects[(request.match_info["bucket"], name)] = data
        return web.json_response({"kind": "storage#object", "bucket": request.match_info["bucket"], "name": name,
                                  "size": str(len(data))})

    async def read(request: web.Request) -> web.Response:
        if (no := refused(request)) is not None:
            return no
        data = objects.get((request.match_info["bucket"], unquote(request.match_info["name"])))
        if data is None:
            return _error(404, "No such object", "NOT_FOUND")
        return web.Response(body=data, content_type="application/octet-stream")

    async def listing(request: web.Request) -> web.Response:
        if (no := refused(request)) is not None:
            return no
        bucket, start = request.match_info["bucket"], request.query.get("prefix", "")
        items = [{"kind": "storage#object", "bucket": b, "name": n, "size": str(len(d))}
                 for (b, n), d in sorted(objects.items()) if b == bucket and n.startswith(start)]
        return web.json_response({"kind": "storage#objects", "items": items})

    # -- batchPredictionJobs ------------------------------------------------------------------------
    def settle(job: dict[str, Any]) -> None:
        if job["state"] == "JOB_STATE_CANCELLING":
            job["state"] = "JOB_STATE_CANCELLED"
        elif job["state"] not in ENDED and time.time() >= job["_ends_at"]:
            model = job["model"].rsplit("/", 1)[-1]
            data = objects.get(_split(job["inputConfig"]["gcsSource"]["uris"][0]), b"")
            lines = [predict_line(raw, model, prefix, n) for n, raw in enumerate(x for x in data.splitlines()
                                                                                  if x.strip())]
            directory = (f"{job['outputConfig']['gcsDestination']['outputUriPrefix'].rstrip('/')}/prediction-model-"
                         f"{time.strftime('%Y-%m-%dT%H:%M:%S', time.gmtime())}.{secrets.token_hex(3)}Z")
            bucket, name = _split(directory)
            objects[(bucket, name + "/predictions.jsonl")] = b"".join(orjson.dumps(x) + b"\n" for x in lines)
            failed = sum(1 for x in lines if x.get("status"))
            job.update(state="JOB_STATE_SUCCEEDED" if not failed or failed < len(lines) else "JOB_STATE_FAILED",
                       outputInfo={"gcsOutputDirectory": directory},
                       completionStats={"successfulCount": str(len(lines) - failed), "failedCount": str(failed)})

    def public(job: dict[str, Any]) -> dict[str, Any]:
        return {k: v for k, v in job.items() if not k.startswith("_")}

    def check(request: web.Request) -> web.Response | None:
        if (no := refused(request)) is not None:
            return no
        m = request.match_info
        if m["project"] != project or m["location"] != location:
            return _error(403, f"Permission denied on resource project {m['project']}.", "PERMISSION_DENIED")
        return None

    async def create(request: web.Request) -> web.Response:
        if (no := check(request)) is not None:
            return no
        try:
            doc = orjson.loads(await request.read())
            uri = doc["inputConfig"]["gcsSource"]["uris"][0]
            assert doc["inputConfig"]["instancesFormat"] == "jsonl"
            assert doc["outputConfig"]["gcsDestination"]["outputUriPrefix"].startswith("gs://")
            assert str(doc["model"]).startswith("publishers/google/models/")
        except (orjson.JSONDecodeError, KeyError, TypeError, IndexError, AssertionError):
            return _error(400, "model (publishers/google/models/...), inputConfig (jsonl, gcsSource.uris) and "
                               "outputConfig.gcsDestination.outputUriPrefix are required", "INVALID_ARGUMENT")
        data = objects.get(_split(uri))
        if data is None:
            return _error(400, f"the input {uri} does not exist", "INVALID_ARGUMENT")
        job_id = str(secrets.randbelow(10**18))
        name = f"projects/{project}/locations/{location}/batchPredictionJobs/{job_id}"
        jobs[job_id] = {"name": name, "displayName": doc.get("displayName", ""), "model": doc["model"],
                        "inputConfig": doc["inputConfig"], "outputConfig": doc["outputConfig"],
                        "state": "JOB_STATE_PENDING", "createTime": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                        "_ends_at": time.time() + seconds + hold_seconds(data.decode("utf-8", "replace"))}
        return web.json_response(public(jobs[job_id]))

    async def get_or_cancel(request: web.Request) -> web.Response:
        if (no := check(request)) is not None:
            return no
        job_id, _, action = request.match_info["job"].partition(":")
        job = jobs.get(job_id)
        if job is None:
            return _error(404, "The BatchPredictionJob does not exist.", "NOT_FOUND")
        if request.method == "POST":
            if action != "cancel":
                return _error(404, f"no method {action}", "NOT_FOUND")
            if job["state"] not in ENDED:
                job["state"] = "JOB_STATE_CANCELLING"
            return web.json_response({})
        settle(job)
        return web.json_response(public(job))

    app.router.add_post("/upload/storage/v1/b/{bucket}/o", upload)
    app.router.add_get("/storage/v1/b/{bucket}/o", listing)
    app.router.add_get("/storage/v1/b/{bucket}/o/{name:.+}", read)
    base = "/v1/projects/{project}/locations/{location}/batchPredictionJobs"
    app.router.add_post(base, create)
    app.router.add_get(base + "/{job}", get_or_cancel)
    app.router.add_post(base + "/{job}", get_or_cancel)
