"""Credentials for cloud upstreams, resolved off the event loop and refreshed before they expire.

AWS credentials come from botocore's chain (environment, shared files and profiles, assumed roles,
web identity, container and instance metadata); Google access tokens from google-auth (a
service-account file, or Application Default Credentials up to the metadata server). Both may do
network I/O, so a refresh runs in a worker thread: the request path reads the current value and
only waits when there is none yet or it has expired; a value near its end is replaced in the
background while calls go on with it. Nothing here logs a secret: failures log the exception's
type and first line, and clients get a generic 502.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Generic, TypeVar

from adapters.cloud_targets import AwsCredentials, AzureTarget, BedrockTarget, CloudTarget, VertexTarget
from contracts.config import Deployment
from contracts.config.clouds import BedrockSettings, VertexSettings
from contracts.errors import UpstreamError

__all__ = ["UpstreamAuth", "upstream_auth", "TokenCache", "aws_credentials", "google_token", "signed_host"]

log = logging.getLogger("modelyard.cloud_credentials")

T = TypeVar("T")

# Static AWS keys are re-read this often (a rotated environment or file takes effect); botocore's
# refreshable ones (roles, SSO) renew themselves ahead of expiry when read.
AWS_RECHECK_S = 60.0
# Google tokens live an hour: replace one this long before it ends.
GOOGLE_MARGIN_S = 300.0
GOOGLE_SCOPES = ("https://www.googleapis.com/auth/cloud-platform",)


class TokenCache(Generic[T]):
    """A value from `fetch` (blocking; run in a thread) with its expiry, refreshed single-flight."""

    def __init__(self, name: str, fetch: Callable[[], tuple[T, float]], margin_s: float) -> None:
        self.name = name
        self._fetch = fetch  # returns (value, expires_at as time.time())
        self._margin = margin_s
        self._value: T | None = None
        self._expires = 0.0
        self._refresh: asyncio.Task[T] | None = None

    async def current(self) -> T:
        now = time.time()
        if self._value is not None and now < self._expires - self._margin:
            return self._value
        task = self._refresh
        if task is None or task.done():
            task = self._refresh = asyncio.get_running_loop().create_task(self._run())
            # A background refresh nobody awaits may fail: _run logged it; do not log it again at GC.
            task.add_done_callback(lambda t: t.cancelled() or t.exception())
        if self._value is not None and now < self._expires:
            return self._value  # still good: the refresh lands in the background
        try:
            return await asyncio.shield(task)
        except Exception as e:
            raise UpstreamError(f"no credentials for upstream {self.name}") from e

    async def _run(self) -> T:
        try:
            value, expires = await asyncio.to_thread(self._fetch)
        except Exception as e:
            first = str(e).splitlines()[0][:200] if str(e) else ""
            log.warning("credentials for %s: refresh failed: %s %s", self.name, type(e).__name__, first)
            raise
        self._value, self._expires = value, expires
        return value


def aws_credentials(settings: BedrockSettings) -> Callable[[], tuple[AwsCredentials, float]]:
    """A fetch for botocore's credential chain as `settings` scope it."""
    import botocore.session

    held: list = []  # the refreshable credentials object, kept so it renews (not re-assumes) its role

    def fetch() -> tuple[AwsCredentials, float]:
        creds = held[0] if held else None
        if creds is None or not hasattr(creds, "refresh_needed"):
            session = botocore.session.Session(profile=settings.profile)
            if settings.credentials_file:
                session.set_config_variable("credentials_file", settings.credentials_file)
            creds = session.get_credentials()
            if creds is None:
                raise RuntimeError("botocore found no AWS credentials")
            held[:] = [creds]
        frozen = creds.get_frozen_credentials()
        # Good for two rechecks: the first one renews it in the background while calls go on.
        return AwsCredentials(frozen.access_key, frozen.secret_key, frozen.token), time.time() + 2 * AWS_RECHECK_S
    return fetch


def google_token(settings: VertexSettings) -> Callable[[], tuple[str, float]]:
    """A fetch for an OAuth2 access token from google-auth."""
    import google.auth
    import urllib3
    from google.auth.transport.urllib3 import Request
    from google.oauth2 import service_account

    http = Request(urllib3.PoolManager())
    held: list = []

    def fetch() -> tuple[str, float]:
        if settings.credentials_file:  # re-read each time: a rotated key file takes effect
            creds = service_account.Credentials.from_service_account_file(settings.credentials_file,
                                                                          scopes=GOOGLE_SCOPES)
        elif held:
            creds = held[0]
        else:
            creds, _ = google.auth.default(scopes=GOOGLE_SCOPES)
            held[:] = [creds]
        creds.refresh(http)
        if not creds.token:
            raise RuntimeError("google-auth returned no access token")
        exp = creds.expiry  # naive UTC, as google-auth keeps it
        expires = exp.replace(tzinfo=UTC).timestamp() if isinstance(exp, datetime) else time.time() + 3000
        return str(creds.token), expires
    return fetch


def signed_host(dep: Deployment) -> str:
    """The Host SigV4 signs: the configured one, else the first endpoint's (port dropped at 443)."""
    assert dep.bedrock is not None
    if dep.bedrock.host:
        return dep.bedrock.host
    host, _, port = dep.endpoints[0].rpartition(":")
    return host if port == "443" else f"{host}:{port}"


@dataclass(frozen=True, slots=True)
class UpstreamAuth:
    credential: str | None  # the key or token the adapter puts in a header
    cloud: CloudTarget | None = None


_caches: dict[tuple[str, object], TokenCache] = {}


def _cache(dep: Deployment, settings: object, make: Callable[[], TokenCache]) -> TokenCache:
    # Keyed by the settings too: a reloaded config with other settings gets a fresh cache.
    key = (dep.cluster, settings)
    cache = _caches.get(key)
    if cache is None:
        cache = _caches[key] = make()
    return cache


async def upstream_auth(dep: Deployment) -> UpstreamAuth:
    """The credential and cloud target to render `dep`'s upstream request with."""
    if dep.azure is not None:
        return UpstreamAuth(dep.credential(), AzureTarget(dep.azure.api_version, dep.azure.auth))
    if dep.bedrock is not None:
        b = dep.bedrock
        creds = await _cache(dep, b, lambda: TokenCache(dep.cluster, aws_credentials(b), AWS_RECHECK_S)).current()
        return UpstreamAuth(None, BedrockTarget(b.region, signed_host(dep), creds))
    if dep.vertex is not None:
        v = dep.vertex
        token = await _cache(dep, v, lambda: TokenCache(dep.cluster, google_token(v), GOOGLE_MARGIN_S)).current()
        return UpstreamAuth(token, VertexTarget(v.project, v.location, v.publisher))
    return UpstreamAuth(dep.credential())
