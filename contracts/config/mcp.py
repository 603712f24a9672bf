"""`mcp_servers:` and `mcp:` in modelyard.yaml: the MCP servers behind `/mcp` (docs/mcp.md).

A server is remote (`url`: streamable HTTP) or local (`command`: a stdio server that `modelyard up`
runs behind its stdio<->HTTP bridge on `port`); the extproc speaks only HTTP to either. A tool is
named `<server>__<tool>` to callers, so a server name holds no `__` and nothing a client's tool-name
rules refuse (letters, digits, `-`).
"""

from __future__ import annotations

import fnmatch
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

# Tool names clients accept: ^[a-zA-Z0-9_-]{1,64}$ (OpenAI's and Anthropic's function-name rules);
# `.` is not in it, so the separator is `__`.
SEPARATOR = "__"
_SERVER_NAME = r"^[a-z0-9](?:[a-z0-9-]{0,30}[a-z0-9])?$"
McpScope = Literal["tenant", "key", "server", "tool"]


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


class McpServer(_Model):
    name: str = Field(pattern=_SERVER_NAME)
    url: str | None = None  # a remote streamable-HTTP server's endpoint (http(s)://host:port/mcp)
    # A local stdio server: argv that `modelyard up` runs behind its bridge, which listens on `listen`
    # (host:port); `python` as argv[0] means the interpreter `up` runs on.
    command: list[str] | None = None
    listen: str | None = Field(None, pattern=r"^[A-Za-z0-9.\-]+:\d{1,5}$")
    # Upstream headers from env vars ({"Authorization": "DEMO_MCP_TOKEN"}): the server's own
    # credentials, injected by the gateway; the caller's are never forwarded.
    headers_env: dict[str, str] = Field(default_factory=dict)
    timeout_s: float = Field(30.0, gt=0, le=3600)
    # The server's tools the gateway exposes at all (globs over the server's own names).
    tools: list[str] = Field(default_factory=lambda: ["*"])

    @model_validator(mode="after")
    def _one_transport(self) -> McpServer:
        if (self.url is None) == (self.command is None):
            raise ValueError("give exactly one of url (remote streamable HTTP) or command (local stdio)")
        if self.command is not None and (not self.command or self.listen is None):
            raise ValueError("a stdio server needs a non-empty command and the host:port its bridge listens on")
        if self.url is not None and not self.url.startswith(("http://", "https://")):
            raise ValueError("url must be http:// or https://")
        return self

    @property
    def endpoint(self) -> str:
        """Where the extproc POSTs: the remote URL, or the local bridge's."""
        return self.url if self.url is not None else f"http://{self.listen}/mcp"

    def exposes(self, tool: str) -> bool:
        return any(fnmatch.fnmatchcase(tool, g) for g in self.tools)


class McpLimit(_Model):
    """A token bucket of MCP calls: per tenant, key, server or tool (`<server>__<tool>`), each
    tenant or key its own bucket when `match` is `*`."""

    scope: McpScope
    match: str = "*"
    rate: float = Field(gt=0, le=1e6)  # calls per second
    burst: float = Field(gt=0, le=1e6)


class McpAccess(_Model):
    """What a tenant or one key (a config key's sha256 digest or a store key's id) may see and call:
    globs over `<server>__<tool>` (`notes__*`: a whole server). A key narrows its tenant's list."""

    tenant: str | None = None
    key: str | None = None
    tools: list[str] = Field(default_factory=lambda: ["*"])

    @model_validator(mode="after")
    def _one_subject(self) -> McpAccess:
        if (self.tenant is None) == (self.key is None):
            raise ValueError("give exactly one of tenant or key")
        return self


class McpOAuthSubject(_Model):
    """Which tenant a bearer token acts for: the first entry whose globs match the token's client
    (`client_id`/`azp`) and subject (`sub`); `tools` narrows the tenant's list, as a key's entry does."""

    client: str = "*"
    subject: str = "*"
    tenant: str
    tools: list[str] = Field(default_factory=lambda: ["*"])


class McpOAuth(_Model):
    """`/mcp` as an OAuth 2.1 resource server (the MCP authorization spec; docs/mcp.md "OAuth"):
    bearer JWTs from `issuer`, checked against its JWKS, for the audience `resource`. Gateway keys
    keep working beside it."""

    resource: str  # this gateway's /mcp URL as clients use it: the audience every token must name
    issuer: str  # the authorization server (the `iss` tokens carry; listed in the resource metadata)
    jwks_url: str  # its signing keys, fetched in the background and cached
    scopes: list[str] = Field(default_factory=lambda: ["mcp"])  # every token must hold all of them
    algorithms: list[str] = Field(default_factory=lambda: ["RS256", "ES256", "PS256", "EdDSA"])
    jwks_refresh_s: float = Field(300.0, gt=0)
    leeway_s: float = Field(30.0, ge=0, le=300)  # clock skew allowed on exp / nbf / iat
    subjects: list[McpOAuthSubject] = Field(default_factory=list)  # no match: 403

    @field_validator("algorithms")
    @classmethod
    def _no_none(cls, v: list[str]) -> list[str]:
        if not v or any(a.lower() == "none" or a.upper().startswith("HS") for a in v):
            raise ValueError("asymmetric algorithms only (a JWKS of public keys; never none or HS*)")
        return v


class McpSettings(_Model):
    # Where a client session's upstream sessions are kept: memory (one process), sqlite (every
    # worker and replica on this host), redis (replicas anywhere: ratelimit.redis.url).
    sessions: Literal["memory", "sqlite", "redis"] = "sqlite"
    sqlite_path: str = "run/mcp-sessions.sqlite"
    session_ttl_s: float = Field(3600.0, gt=0)
    # SSE streams (docs/mcp.md "Streams and resumption"): their events are kept this long, in the
    # sessions' store, for a client that resumes with Last-Event-ID (on any replica).
    event_ttl_s: float = Field(600.0, gt=0)
    # The host Envoy dials for this extproc's stream relay (an ephemeral port on it); default: the
    # extproc's own address host; with a wildcard (0.0.0.0: a container), what its hostname resolves to.
    relay_host: str | None = None
    oauth: McpOAuth | None = None  # bearer tokens beside gateway keys (an OAuth 2.1 resource server)
    access: list[McpAccess] = Field(default_factory=list)  # no entry for a tenant: every exposed tool
    limits: list[McpLimit] = Field(default_factory=list)

    @field_validator("access")
    @classmethod
    def _unique_subjects(cls, v: list[McpAccess]) -> list[McpAccess]:
        seen: set[tuple[str | None, str | None]] = set()
        for i, a in enumerate(v):
            if (a.tenant, a.key) in seen:
                raise ValueError(f"access[{i}]: a second entry for the same tenant or key")
            seen.add((a.tenant, a.key))
        return v


def allowed(patterns: list[str], name: str) -> bool:
    return any(fnmatch.fnmatchcase(name, g) for g in patterns)


def longest_call_s(servers: list[McpServer]) -> float:
    """How long an /mcp POST may wait on its servers: Envoy's ext_proc message timer must allow it."""
    return max((s.timeout_s for s in servers), default=0.0)
