"""File bytes in an S3-compatible bucket (`batches.file_store: {kind: s3}`; docs/batches.md): PUT,
GET and DELETE of one object per file, path-style, SigV4-signed with botocore's S3 signer. Signing
hashes the whole body, so it runs in a worker thread; the request itself is aiohttp's, on the loop.

Credentials are read when used (environment variables, or a shared credentials file mounted from a
secret), so a rotated secret is picked up; they are never logged, and an S3 error is logged by its
status and code only.
"""

from __future__ import annotations

import asyncio
import configparser
import hashlib
import logging
import os
import re
from urllib.parse import quote

import aiohttp

from adapters.cloud_targets import AwsCredentials
from contracts.config import S3FileStore
from contracts.errors import NotFound, Unavailable

log = logging.getLogger("modelyard.batches.s3")
_CODE = re.compile(rb"<Code>([A-Za-z0-9]{1,64})</Code>")


def credentials(cfg: S3FileStore) -> AwsCredentials:
    """The keys to sign with, read now; Unavailable when none are configured."""
    if cfg.credentials_file:
        cp = configparser.ConfigParser()
        if cp.read(cfg.credentials_file) and cp.has_section(cfg.profile):
            sec = cp[cfg.profile]
            key, secret = sec.get("aws_access_key_id"), sec.get("aws_secret_access_key")
            if key and secret:
                return AwsCredentials(key, secret, sec.get("aws_session_token"))
    else:
        key, secret = os.environ.get(cfg.access_key_env), os.environ.get(cfg.secret_key_env)
        if key and secret:
            return AwsCredentials(key, secret, os.environ.get(cfg.session_token_env) or None)
    log.error("S3 file store: no credentials (%s)", "credentials file" if cfg.credentials_file
              else f"{cfg.access_key_env}/{cfg.secret_key_env}")
    raise Unavailable("the file store is unavailable; retry", retry_after_s=1.0)


def signed_headers(method: str, url: str, body: bytes, region: str, creds: AwsCredentials) -> dict[str, str]:
    """The headers of a SigV4-signed S3 request (x-amz-date, x-amz-content-sha256, authorization)."""
    from botocore.auth import S3SigV4Auth
    from botocore.awsrequest import AWSRequest
    from botocore.credentials import ReadOnlyCredentials

    req = AWSRequest(method=method, url=url, data=body)
    S3SigV4Auth(ReadOnlyCredentials(creds.access_key, creds.secret_key, creds.session_token), "s3", region).add_auth(req)
    return {k: v for k, v in req.headers.items() if k.lower() not in ("content-length",)}


class S3Blobs:
    def __init__(self, cfg: S3FileStore) -> None:
        self.cfg = cfg
        self._session: aiohttp.ClientSession | None = None

    def key(self, tenant: str, file_id: str) -> str:
        # The tenant as a digest: any tenant name makes a safe key, and the key leaks no name.
        return f"{self.cfg.prefix}{hashlib.sha256(tenant.encode()).hexdigest()[:16]}/{file_id}"

    def _url(self, key: str) -> str:
        return f"{self.cfg.endpoint}/{self.cfg.bucket}/{quote(key, safe='/-_.~')}"

    async def _call(self, method: str, key: str, body: bytes = b"") -> tuple[int, bytes]:
        url = self._url(key)
        # The credentials file is read in the worker thread too: no file I/O on the event loop.
        headers = await asyncio.to_thread(lambda: signed_headers(method, url, body, self.cfg.region, credentials(self.cfg)))
        if self._session is None:
            self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=self.cfg.timeout_s),
                                                  auto_decompress=False)
        try:
            async with self._session.request(method, url, data=body if method == "PUT" else None,
                                             headers=headers, skip_auto_headers=("content-type",)) as r:
                return r.status, await r.read()
        except (aiohttp.ClientError, TimeoutError) as e:
            log.error("S3 file store: %s %s: %s", method, self.cfg.bucket, type(e).__name__)
            raise Unavailable("the file store is unavailable; retry", retry_after_s=1.0) from None

    def _failed(self, method: str, status: int, body: bytes) -> Unavailable:
        m = _CODE.search(body)
        log.error("S3 file store: %s in bucket %s answered %d %s", method, self.cfg.bucket, status,
                  m.group(1).decode() if m else "")
        return Unavailable("the file store is unavailable; retry", retry_after_s=1.0)

    async def put(self, key: str, data: bytes) -> None:
        status, body = await self._call("PUT", key, data)
        if status != 200:
            raise self._failed("PUT", status, body)

    async def get(self, key: str) -> bytes:
        status, body = await self._call("GET", key)
        if status == 404:
            raise NotFound("No such File object")
        if status != 200:
            raise self._failed("GET", status, body)
        return body

    async def delete(self, key: str) -> None:
        status, body = await self._call("DELETE", key)
        if status not in (200, 204, 404):
            raise self._failed("DELETE", status, body)

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
