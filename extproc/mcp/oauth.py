"""`/mcp` as an OAuth 2.1 resource server (the MCP authorization spec; docs/mcp.md "OAuth").

A bearer JWT is checked against the issuer's signing keys (its JWKS, fetched in the background and
cached; a key id not seen yet triggers one awaited refresh, at most every few seconds), for
signature, `iss`, `exp`/`nbf`, the audience (this gateway's resource URL, RFC 8707) and the required
scopes; its client and subject then name a tenant and narrow its tools. Refusals carry the
`WWW-Authenticate` challenge that points a client at the Protected Resource Metadata (RFC 9728).
"""

from __future__ import annotations

import asyncio
import contextlib
import fnmatch
import logging
import time
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import aiohttp
import jwt

from contracts.config.mcp import McpOAuth, McpOAuthSubject
from contracts.errors import ClientError

log = logging.getLogger("modelyard.mcp.oauth")

WELL_KNOWN = "/.well-known/oauth-protected-resource"
_REFRESH_AT_MOST_S = 5.0  # an unknown key id refreshes the JWKS, but a flood of bad ids does not


@dataclass(frozen=True, slots=True)
class Grant:
    """What a valid token says: who (client, subject), for which tenant, with which tools."""

    client: str
    subject: str
    tenant: str
    tools: tuple[str, ...]
    scopes: tuple[str, ...]

    @property
    def key_id(self) -> str:
        # The audit rows' and buckets' "key": the OAuth client and subject, as a store key's id is.
        return f"oauth:{self.client}:{self.subject}"[:200]


def looks_like_jwt(credential: str) -> bool:
    return credential.count(".") == 2 and not credential.startswith("sk-")


def metadata_url(resource: str) -> str:
    """RFC 9728 section 3.1: the well-known path inserted before the resource's own path."""
    u = urlsplit(resource)
    return f"{u.scheme}://{u.netloc}{WELL_KNOWN}{u.path.rstrip('/')}"


def metadata_paths(resource: str) -> tuple[str, ...]:
    """The paths the metadata is served on: the RFC's (with the resource path) and the bare one."""
    return tuple(dict.fromkeys((urlsplit(metadata_url(resource)).path, WELL_KNOWN)))


def match_subject(rules: list[McpOAuthSubject], client: str, subject: str) -> McpOAuthSubject | None:
    return next((r for r in rules if fnmatch.fnmatchcase(client, r.client) and fnmatch.fnmatchcase(subject, r.subject)),
                None)


def token_scopes(claims: dict[str, Any]) -> tuple[str, ...]:
    scope = claims.get("scope", claims.get("scp", ""))
    if isinstance(scope, str):
        return tuple(scope.split())
    return tuple(str(s) for s in scope) if isinstance(scope, list) else ()


class TokenVerifier:
    def __init__(self, settings: McpOAuth) -> None:
        self.settings = settings
        self._keys: dict[str, jwt.PyJWK] = {}
        self._unnamed: list[jwt.PyJWK] = []  # keys without a kid: tried in turn
        self._fetched_at = 0.0
        self._refreshing: asyncio.Task[None] | None = None
        self._poller: asyncio.Task[None] | None = None
        self._http: aiohttp.ClientSession | None = None

    # -- what clients are told -------------------------------------------------------------------------

    def metadata(self) -> dict[str, Any]:
        """The Protected Resource Metadata document (RFC 9728)."""
        s = self.settings
        return {"resource": s.resource, "authorization_servers": [s.issuer], "scopes_supported": s.scopes,
                "bearer_methods_supported": ["header"], "resource_name": "Modelyard MCP gateway"}

    def challenge(self, error: str | None = None, description: str | None = None) -> tuple[str, str]:
        parts = [f'resource_metadata="{metadata_url(self.settings.resource)}"',
                 f'scope="{" ".join(self.settings.scopes)}"']
        if error:
            parts.append(f'error="{error}"')
        if description:
            parts.append('error_description="{}"'.format(description.replace('"', "'")[:200]))
        return "www-authenticate", "Bearer " + ", ".join(parts)

    def refused(self, status: int, error: str, description: str) -> ClientError:
        return ClientError(description, status=status, headers=[self.challenge(error, description)])

    # -- a token -------------------------------------------------------------------------------------

    async def verify(self, token: str) -> Grant:
        """The token's grant, or a ClientError (401 invalid_token, 403 insufficient_scope) with the
        challenge header."""
        s = self.settings
        self._start()
        try:
            header = jwt.get_unverified_header(token)
        except jwt.InvalidTokenError:
            raise self.refused(401, "invalid_token", "the bearer token is not a JWT") from None
        if header.get("alg") not in s.algorithms:
            raise self.refused(401, "invalid_token", f"token algorithm {str(header.get('alg'))[:20]!r} is not accepted")
        kid = header.get("kid")
        candidates = await self._keys_for(kid if isinstance(kid, str) else None)
        if not candidates:
            raise self.refused(401, "invalid_token", "the token's signing key is not the issuer's")
        claims: dict[str, Any] | None = None
        reason = "invalid token"
        for key in candidates:
            try:
                claims = jwt.decode(token, key=key.key, algorithms=s.algorithms, audience=s.resource, issuer=s.issuer,
                                    leeway=s.leeway_s, options={"require": ["exp", "iss", "aud"]})
                break
            except jwt.ExpiredSignatureError:
                raise self.refused(401, "invalid_token", "the token has expired") from None
            except jwt.InvalidAudienceError:
                raise self.refused(401, "invalid_token", "the token is not for this resource (audience)") from None
            except jwt.InvalidIssuerError:
                raise self.refused(401, "invalid_token", "the token is not from the accepted issuer") from None
            except jwt.InvalidTokenError as e:
                reason = f"invalid token: {type(e).__name__}"
        if claims is None:
            raise self.refused(401, "invalid_token", reason)
        scopes = token_scopes(claims)
        missing = [x for x in s.scopes if x not in scopes]
        if missing:
            raise self.refused(403, "insufficient_scope", f"the token lacks the scope {' '.join(missing)!r}")
        client = str(claims.get("client_id") or claims.get("azp") or "")
        subject = str(claims.get("sub") or client)
        rule = match_subject(s.subjects, client, subject)
        if rule is None:
            raise self.refused(403, "insufficient_scope", "the token's client and subject act for no tenant here")
        return Grant(client, subject, rule.tenant, tuple(rule.tools), scopes)

    def tools_of(self, key_id: str | None) -> tuple[str, ...] | None:
        """The tool globs of a grant's `key_id` (its client and subject, matched again: pure config)."""
        if not key_id or not key_id.startswith("oauth:"):
            return None
        client, _, subject = key_id[len("oauth:"):].partition(":")
        rule = match_subject(self.settings.subjects, client, subject)
        return tuple(rule.tools) if rule is not None else ()

    # -- the issuer's keys ---------------------------------------------------------------------------

    async def _keys_for(self, kid: str | None) -> list[jwt.PyJWK]:
        found = self._pick(kid)
        if not found and time.monotonic() - self._fetched_at > _REFRESH_AT_MOST_S:
            await self._refresh_once()  # a rotated key: fetch now (bounded), the poller only every jwks_refresh_s
            found = self._pick(kid)
        return found

    def _pick(self, kid: str | None) -> list[jwt.PyJWK]:
        if kid is not None and kid in self._keys:
            return [self._keys[kid]]
        return list(self._unnamed) if kid is None or not self._keys else []

    async def _refresh_once(self) -> None:
        if self._refreshing is None or self._refreshing.done():
            self._refreshing = asyncio.create_task(self._fetch())
        with contextlib.suppress(Exception):
            await asyncio.wait_for(asyncio.shield(self._refreshing), 3.0)

    def _start(self) -> None:
        if self._poller is None:
            self._poller = asyncio.create_task(self._poll())

    async def _poll(self) -> None:
        while True:
            await self._refresh_once()
            await asyncio.sleep(self.settings.jwks_refresh_s)

    async def _fetch(self) -> None:
        self._fetched_at = time.monotonic()
        if self._http is None or self._http.closed:
            self._http = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=3.0))
        try:
            async with self._http.get(self.settings.jwks_url) as r:
                doc = await r.json(content_type=None)
            keys, unnamed = {}, []
            for jwk in doc.get("keys", []) if isinstance(doc, dict) else []:
                try:
                    k = jwt.PyJWK.from_dict(jwk)
                except (jwt.PyJWKError, jwt.InvalidKeyError, ValueError, TypeError):
                    continue  # a key type or use we cannot read: skipped, not fatal
                if jwk.get("use", "sig") != "sig":
                    continue
                if isinstance(jwk.get("kid"), str):
                    keys[jwk["kid"]] = k
                else:
                    unnamed.append(k)
            self._keys, self._unnamed = keys, unnamed
        except (aiohttp.ClientError, OSError, TimeoutError, ValueError) as e:
            # The last keys stay: an issuer briefly down does not refuse every caller.
            log.warning("JWKS %s: %s", self.settings.jwks_url, type(e).__name__)

    async def close(self) -> None:
        for t in (self._poller, self._refreshing):
            if t is not None:
                t.cancel()
        if self._http is not None:
            await self._http.close()
