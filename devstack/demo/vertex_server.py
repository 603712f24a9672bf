"""Demo Vertex AI upstream: Gemini and Claude at Vertex's publisher paths, refusing any call without
an OAuth2 access token it issued, and the token endpoint that issues them (Google's OAuth2 JWT
bearer grant, the exchange google-auth makes for a service-account key); batch prediction jobs and a
Cloud Storage JSON API stand-in for them (devstack/demo/vertex_jobs.py).

    python -m devstack.demo.vertex_server --port 8108 --project P --location L \
        --service-account-file PATH [--token-ttl 3600]

The service-account file is created when missing (a fresh RSA key, this server's /token as its
token_uri, mode 0600) and re-read when it changes: rotate the key by rewriting it. Answers as
`devstack.demo.behaviour` describes.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import time
from pathlib import Path

import orjson
from aiohttp import web
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from google.auth import exceptions as google_exceptions
from google.auth import jwt

from adapters import anthropic, gemini
from devstack.demo import cloud_images
from devstack.demo.adapter_server import AdapterDemo, DemoSite, serve
from devstack.demo.vertex_jobs import add_job_routes

JWT_BEARER = "urn:ietf:params:oauth:grant-type:jwt-bearer"
# google-auth signs its assertion for Google's token endpoint whatever the file's token_uri says.
GOOGLE_TOKEN_AUDIENCE = "https://oauth2.googleapis.com/token"


class ServiceAccount:
    """The demo's view of the key it accepts token requests from (the public half of the file's)."""

    def __init__(self, path: str, token_uri: str, project: str) -> None:
        self.path = Path(path)
        self._seen: tuple[float, bytes, str] | None = None
        if not self.path.exists():
            key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
            pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                    serialization.NoEncryption()).decode()
            info = {"type": "service_account", "project_id": project, "private_key_id": secrets.token_hex(20),
                    "private_key": pem, "client_email": f"modelyard-demo@{project}.iam.gserviceaccount.com",
                    "client_id": str(secrets.randbelow(10**20)), "token_uri": token_uri}
            self.path.parent.mkdir(parents=True, exist_ok=True)
            try:
                fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            except FileExistsError:  # another demo wrote it first: use that one
                return
            with os.fdopen(fd, "w") as f:
                json.dump(info, f)

    def public(self) -> tuple[bytes, str]:
        """(the public key PEM, the client_email) of the file as it is now."""
        mtime = self.path.stat().st_mtime
        if self._seen is None or self._seen[0] != mtime:
            info = json.loads(self.path.read_text())
            key = serialization.load_pem_private_key(info["private_key"].encode(), None)
            pub = key.public_key().public_bytes(serialization.Encoding.PEM,
                                                serialization.PublicFormat.SubjectPublicKeyInfo)
            self._seen = (mtime, pub, info["client_email"])
        return self._seen[1], self._seen[2]


def _google_error(status: int, message: str, st: str) -> web.Response:
    return web.Response(status=status, body=orjson.dumps({"error": {"code": status, "message": message,
                                                                     "status": st}}),
                        content_type="application/json")


def make_app(account: ServiceAccount, *, project: str, location: str, name: str = "demo-vertex",
             token_ttl: int = 3600, chunk_delay: float = 0.0) -> web.Application:
    demos = {"google": AdapterDemo(gemini, f"[{name}]", chunk_delay=chunk_delay),
             "anthropic": AdapterDemo(anthropic, f"[{name}]", chunk_delay=chunk_delay)}
    tokens: dict[str, float] = {}  # access token -> expiry (time.time())
    stats = {"tokens_issued": 0, "images": 0}

    async def token(request: web.Request) -> web.Response:
        form = await request.post()
        if form.get("grant_type") != JWT_BEARER or not isinstance(form.get("assertion"), str):
            return web.json_response({"error": "unsupported_grant_type"}, status=400)
        pub, email = account.public()
        try:
            claims = jwt.decode(str(form["assertion"]), certs=pub,
                                audience=[GOOGLE_TOKEN_AUDIENCE, str(request.url.with_query(None))])
        except (ValueError, google_exceptions.GoogleAuthError) as e:
            return web.json_response({"error": "invalid_grant", "error_description": str(e)[:200]}, status=400)
        if claims.get("iss") != email or "cloud-platform" not in str(claims.get("scope", "")):
            return web.json_response({"error": "invalid_grant", "error_description": "wrong issuer or scope"},
                                     status=400)
        now = time.time()
        for t in [t for t, exp in tokens.items() if exp < now]:
            del tokens[t]
        access = "ya29.demo-" + secrets.token_urlsafe(32)
        tokens[access] = now + token_ttl
        stats["tokens_issued"] += 1
        return web.json_response({"access_token": access, "expires_in": token_ttl, "token_type": "Bearer"})

    def unauthenticated(request: web.Request) -> web.Response | None:
        auth = request.headers.get("authorization", "")
        exp = tokens.get(auth[7:]) if auth[:7].lower() == "bearer " else None
        if exp is None or exp < time.time():
            return _google_error(401, "Request had invalid authentication credentials. Expected OAuth 2 access "
                                      "token, login cookie or other valid authentication credential.",
                                 "UNAUTHENTICATED")
        return None

    async def predict(request: web.Request) -> web.StreamResponse:
        if (no := unauthenticated(request)) is not None:
            return no
        m = request.match_info
        if m["project"] != project or m["location"] != location:
            return _google_error(403, f"Permission denied on resource project {m['project']}.", "PERMISSION_DENIED")
        model, _, action = m["tail"].rpartition(":")
        if m["publisher"] == "google" and action == "predict":  # Imagen (devstack/demo/cloud_images.py)
            status, answer = cloud_images.imagen(await request.read())
            stats["images"] += status == 200
            return web.json_response(answer, status=status)
        if m["publisher"] == "google" and action == "generateContent" and cloud_images.wants_image(await request.read()):
            status, answer = cloud_images.gemini_image(await request.read())
            stats["images"] += status == 200
            return web.json_response(answer, status=status)
        demo = demos.get(m["publisher"])
        ok = {"google": ("generateContent", "streamGenerateContent"),
              "anthropic": ("rawPredict", "streamRawPredict")}.get(m["publisher"], ())
        if demo is None or not model or action not in ok:
            return _google_error(404, f"Publisher model {m['tail']} not found.", "NOT_FOUND")
        stream = action.startswith("stream")
        if m["publisher"] == "google" and stream and request.query.get("alt") != "sse":
            return _google_error(400, "this demo streams server-sent events only: add ?alt=sse", "INVALID_ARGUMENT")
        if m["publisher"] == "anthropic":
            body = orjson.loads(await request.read() or b"{}")
            if body.get("anthropic_version") != "vertex-2023-10-16" or "model" in body:
                return _google_error(400, "anthropic_version must be vertex-2023-10-16 and the model only in the "
                                          "path", "INVALID_ARGUMENT")
        return await demos[m["publisher"]].handle(request, model, stream)

    async def health(_: web.Request) -> web.Response:
        return web.json_response({"status": "ok", "name": name})

    async def stats_view(_: web.Request) -> web.Response:
        return web.json_response({"requests": sum(d.requests for d in demos.values()), **stats})

    app = web.Application(client_max_size=64 * 1024 * 1024)
    app.router.add_post("/token", token)
    app.router.add_post("/v1/projects/{project}/locations/{location}/publishers/{publisher}/models/{tail}", predict)
    app.router.add_get("/health", health)
    app.router.add_get("/stats", stats_view)
    # Batch prediction jobs and the Cloud Storage stand-in they read and write (devstack/demo/vertex_jobs.py).
    add_job_routes(app, unauthenticated, prefix=f"[{name}]", project=project, location=location)
    return app


def build(argv: list[str] | None = None) -> DemoSite:
    p = argparse.ArgumentParser(description="demo Vertex AI model server (Gemini and Claude) with a token endpoint")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8108)
    p.add_argument("--name", default="demo-vertex", help="the reply prefix: tells which upstream answered")
    p.add_argument("--project", default="modelyard-demo")
    p.add_argument("--location", default="us-central1")
    p.add_argument("--service-account-file", required=True, help="created (with a fresh key) when missing")
    p.add_argument("--token-ttl", type=int, default=3600, help="seconds an issued access token lives")
    p.add_argument("--chunk-delay", type=float, default=0.0, help="seconds between stream events")
    a = p.parse_args(argv)
    account = ServiceAccount(a.service_account_file, f"http://{a.host}:{a.port}/token", a.project)
    return DemoSite(make_app(account, project=a.project, location=a.location, name=a.name, token_ttl=a.token_ttl,
                             chunk_delay=a.chunk_delay), a.host, a.port)


def main(argv: list[str] | None = None) -> int:
    return serve(build(argv))


if __name__ == "__main__":
    raise SystemExit(main())
