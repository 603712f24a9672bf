"""Demo AWS Bedrock upstream: Converse, ConverseStream, InvokeModel (Titan Image) and batch
inference jobs (devstack/demo/bedrock_jobs.py, with `--s3-endpoint`), refusing any
request whose SigV4 signature does not verify (botocore computes it the way AWS does) against its
credentials.

    python -m devstack.demo.bedrock_server --port 8107 --region us-east-1 \
        [--credentials-file PATH [--profile NAME]]

The credentials are a profile of an AWS shared credentials file (created with fresh random keys
when missing, mode 0600, and re-read when it changes: rotate by rewriting it), else the
AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY / AWS_SESSION_TOKEN environment. Answers as
`devstack.demo.behaviour` describes; streams are `application/vnd.amazon.eventstream`.
"""

from __future__ import annotations

import argparse
import configparser
import os
import secrets
from pathlib import Path
from urllib.parse import unquote

import orjson
from aiohttp import web

from adapters import bedrock
from adapters.bedrock.signing import verify
from adapters.cloud_targets import AwsCredentials
from devstack.demo import cloud_images
from devstack.demo.adapter_server import AdapterDemo, DemoSite, serve
from devstack.demo.bedrock_jobs import add_job_routes


class CredentialSource:
    """The demo's own view of the keys: a shared credentials file's profile, or the environment."""

    def __init__(self, path: str | None, profile: str) -> None:
        self.path = Path(path) if path else None
        self.profile = profile
        self._seen: tuple[float, AwsCredentials] | None = None
        if self.path is not None and not self.path.exists():
            self.path.parent.mkdir(parents=True, exist_ok=True)
            try:
                fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            except FileExistsError:  # another demo wrote it first: use that one
                return
            with os.fdopen(fd, "w") as f:
                f.write(f"[{profile}]\naws_access_key_id = AKIADEMO{secrets.token_hex(6).upper()}\n"
                        f"aws_secret_access_key = {secrets.token_urlsafe(30)}\n")

    def current(self) -> AwsCredentials | None:
        if self.path is None:
            key, secret = os.environ.get("AWS_ACCESS_KEY_ID"), os.environ.get("AWS_SECRET_ACCESS_KEY")
            return AwsCredentials(key, secret, os.environ.get("AWS_SESSION_TOKEN")) if key and secret else None
        mtime = self.path.stat().st_mtime
        if self._seen is None or self._seen[0] != mtime:
            cp = configparser.ConfigParser()
            cp.read(self.path)
            sec = cp[self.profile]
            self._seen = (mtime, AwsCredentials(sec["aws_access_key_id"], sec["aws_secret_access_key"],
                                                sec.get("aws_session_token")))
        return self._seen[1]


def _refuse(status: int, error_type: str, message: str) -> web.Response:
    return web.Response(status=status, body=orjson.dumps({"message": message}), content_type="application/json",
                        headers={"x-amzn-ErrorType": error_type})


def make_app(name: str = "demo-bedrock", region: str = "us-east-1", credentials: CredentialSource | None = None,
             chunk_delay: float = 0.0, s3_endpoint: str | None = None) -> web.Application:
    # Bedrock caches only what a cachePoint marks: so does its demo.
    demo = AdapterDemo(bedrock, f"[{name}]", chunk_delay=chunk_delay, explicit_cache=True)
    source = credentials or CredentialSource(None, "default")

    async def refused(request: web.Request) -> web.Response | None:
        creds = source.current()
        if creds is None:
            return _refuse(403, "UnrecognizedClientException", "The security token included in the request is invalid.")
        body = await request.read()  # aiohttp keeps it: handle() reads the same bytes
        why = verify(request.method, request.raw_path, dict(request.headers), body, region=region, creds=creds)
        return _refuse(403, "InvalidSignatureException", why) if why is not None else None

    async def invoke(request: web.Request) -> web.StreamResponse:
        """InvokeModel: the Titan Image Generator's text-to-image task (devstack/demo/cloud_images.py)."""
        no = await refused(request)
        if no is not None:
            return no
        demo.requests += 1
        return cloud_images.titan(await request.read())

    async def converse(request: web.Request) -> web.StreamResponse:
        no = await refused(request)
        if no is not None:
            return no
        return await demo.handle(request, unquote(request.match_info["model"]), request.path.endswith("-stream"))

    async def health(_: web.Request) -> web.Response:
        return web.json_response({"status": "ok", "name": name})

    async def stats(_: web.Request) -> web.Response:
        return web.json_response({"requests": demo.requests})

    app = web.Application(client_max_size=64 * 1024 * 1024)
    app.router.add_post("/model/{model}/converse", converse)
    app.router.add_post("/model/{model}/converse-stream", converse)
    app.router.add_post("/model/{model}/invoke", invoke)
    app.router.add_get("/health", health)
    app.router.add_get("/stats", stats)
    # Batch inference jobs (devstack/demo/bedrock_jobs.py), reading and writing the S3 at s3_endpoint.
    add_job_routes(app, refused, prefix=f"[{name}]", region=region, credentials=source.current,
                   s3_endpoint=s3_endpoint)
    return app


def build(argv: list[str] | None = None) -> DemoSite:
    p = argparse.ArgumentParser(description="demo AWS Bedrock (Converse) model server")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8107)
    p.add_argument("--name", default="demo-bedrock", help="the reply prefix: tells which upstream answered")
    p.add_argument("--region", default="us-east-1")
    p.add_argument("--credentials-file", default=None, help="AWS shared credentials file (created when missing)")
    p.add_argument("--profile", default="default")
    p.add_argument("--chunk-delay", type=float, default=0.0, help="seconds between stream events")
    p.add_argument("--s3-endpoint", default=None, help="the S3 its batch inference jobs read and write")
    a = p.parse_args(argv)
    return DemoSite(make_app(a.name, a.region, CredentialSource(a.credentials_file, a.profile), a.chunk_delay,
                             a.s3_endpoint), a.host, a.port)


def main(argv: list[str] | None = None) -> int:
    return serve(build(argv))


if __name__ == "__main__":
    raise SystemExit(main())
