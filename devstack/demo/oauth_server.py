"""Demo OAuth 2.1 authorization server for `/mcp` (docs/mcp.md "OAuth"): the official MCP SDK's own
authorization-server handlers (metadata, dynamic client registration, authorize with PKCE, token,
revoke) over an in-memory store that auto-approves one demo user and issues RS256 JWT access tokens
bound to the requested resource (RFC 8707), with its public key at `/jwks`.

    python -m devstack.demo.oauth_server --port 8140 [--resource http://127.0.0.1:10000/mcp]

For demos and tests only: no login page (every authorization is the demo user's).
"""

from __future__ import annotations

import argparse
import secrets
import time
from typing import Any

import jwt
import uvicorn
from cryptography.hazmat.primitives.asymmetric import rsa
from mcp.server.auth.provider import (
    AccessToken,
    AuthorizationCode,
    AuthorizationParams,
    RefreshToken,
    construct_redirect_uri,
)
from mcp.server.auth.routes import create_auth_routes
from mcp.server.auth.settings import ClientRegistrationOptions, RevocationOptions
from mcp.shared.auth import OAuthClientInformationFull, OAuthToken
from pydantic import AnyHttpUrl
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

DEMO_USER = "demo-user"
SCOPES = ["mcp"]
KID = "demo-oauth-1"


class DemoProvider:
    """The SDK's OAuthAuthorizationServerProvider protocol, in memory; access tokens are JWTs."""

    def __init__(self, issuer: str, default_resource: str | None, ttl_s: int = 3600) -> None:
        self.issuer = issuer
        self.default_resource = default_resource
        self.ttl_s = ttl_s
        self.key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        self.clients: dict[str, OAuthClientInformationFull] = {}
        self.codes: dict[str, AuthorizationCode] = {}
        self.refresh: dict[str, RefreshToken] = {}

    def jwks(self) -> dict[str, Any]:
        jwk = jwt.algorithms.RSAAlgorithm.to_jwk(self.key.public_key(), as_dict=True)
        return {"keys": [{**jwk, "kid": KID, "use": "sig", "alg": "RS256"}]}

    def mint(self, *, client_id: str, subject: str, scopes: list[str], resource: str | None,
             ttl_s: int | None = None, **extra: Any) -> str:
        """A signed access token (tests mint wrong ones with `extra`: another aud, iss, exp)."""
        now = int(time.time())
        claims = {"iss": self.issuer, "sub": subject, "client_id": client_id, "scope": " ".join(scopes),
                  "aud": resource or self.default_resource, "iat": now, "exp": now + (ttl_s or self.ttl_s),
                  "jti": secrets.token_hex(8), **extra}
        return jwt.encode(claims, self.key, algorithm="RS256", headers={"kid": KID})

    async def get_client(self, client_id: str) -> OAuthClientInformationFull | None:
        return self.clients.get(client_id)

    async def register_client(self, client_info: OAuthClientInformationFull) -> None:
        assert client_info.client_id is not None
        self.clients[client_info.client_id] = client_info

    async def authorize(self, client: OAuthClientInformationFull, params: AuthorizationParams) -> str:
        code = secrets.token_urlsafe(24)
        assert client.client_id is not None
        self.codes[code] = AuthorizationCode(
            code=code, scopes=params.scopes or SCOPES, expires_at=time.time() + 300, client_id=client.client_id,
            code_challenge=params.code_challenge, redirect_uri=params.redirect_uri,
            redirect_uri_provided_explicitly=params.redirect_uri_provided_explicitly, resource=params.resource,
            subject=DEMO_USER)
        return construct_redirect_uri(str(params.redirect_uri), code=code, state=params.state)

    async def load_authorization_code(self, client: OAuthClientInformationFull, authorization_code: str
                                      ) -> AuthorizationCode | None:
        return self.codes.get(authorization_code)

    async def exchange_authorization_code(self, client: OAuthClientInformationFull, authorization_code: AuthorizationCode
                                          ) -> OAuthToken:
        self.codes.pop(authorization_code.code, None)
        return self._tokens(authorization_code.client_id, authorization_code.subject or DEMO_USER,
                            authorization_code.scopes, authorization_code.resource)

    async def load_refresh_token(self, client: OAuthClientInformationFull, refresh_token: str) -> RefreshToken | None:
        return self.refresh.get(refresh_token)

    async def exchange_refresh_token(self, client: OAuthClientInformationFull, refresh_token: RefreshToken,
                                     scopes: list[str]) -> OAuthToken:
        self.refresh.pop(refresh_token.token, None)
        return self._tokens(refresh_token.client_id, refresh_token.subject or DEMO_USER,
                            scopes or refresh_token.scopes, refresh_token.resource)

    async def load_access_token(self, token: str) -> AccessToken | None:
        return None  # the resource server checks JWTs itself (signature, audience, expiry)

    async def revoke_token(self, token: AccessToken | RefreshToken) -> None:
        self.refresh.pop(token.token, None)

    def _tokens(self, client_id: str, subject: str, scopes: list[str], resource: str | None) -> OAuthToken:
        refresh = secrets.token_urlsafe(24)
        self.refresh[refresh] = RefreshToken(token=refresh, client_id=client_id, scopes=scopes, resource=resource,
                                             subject=subject)
        return OAuthToken(access_token=self.mint(client_id=client_id, subject=subject, scopes=scopes,
                                                 resource=resource),
                          token_type="Bearer", expires_in=self.ttl_s, scope=" ".join(scopes), refresh_token=refresh)


def build_app(issuer: str, resource: str | None = None) -> tuple[Starlette, DemoProvider]:
    issuer = str(AnyHttpUrl(issuer))  # as the metadata says it (a trailing slash): tokens carry the same
    provider = DemoProvider(issuer, resource)
    routes = create_auth_routes(provider, AnyHttpUrl(issuer),
                                client_registration_options=ClientRegistrationOptions(enabled=True, valid_scopes=SCOPES,
                                                                                      default_scopes=SCOPES),
                                revocation_options=RevocationOptions(enabled=True))

    async def jwks(_request: Request) -> Response:
        return JSONResponse(provider.jwks())

    async def health(_request: Request) -> Response:
        return PlainTextResponse("ok")

    return Starlette(routes=[*routes, Route("/jwks", jwks), Route("/health", health)]), provider


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="demo OAuth 2.1 authorization server (MCP SDK handlers)")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8140)
    p.add_argument("--resource", default=None, help="the audience when a client names none")
    args = p.parse_args(argv)
    app, _ = build_app(f"http://{args.host}:{args.port}", args.resource)
    uvicorn.run(app, host=args.host, port=args.port, log_level="warning")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
