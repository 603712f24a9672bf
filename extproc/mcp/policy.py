"""Who may see and call which tool, and which buckets a call charges: pure decisions over config.

A tool is visible when its server exposes it, the tenant's `mcp.access` entry allows its prefixed
name (no entry: all), and the key's entry (a config key's `sha256:` digest or a store key's id)
allows it too; a tool not visible is refused exactly as an unknown one is.
"""

from __future__ import annotations

from dataclasses import dataclass

from adapters.mcp.names import split_name
from contracts.config.mcp import SEPARATOR, McpLimit, McpServer, McpSettings, allowed
from ratelimit.bucket import NANO, BucketParams
from ratelimit.rules import BucketScope, Charge


@dataclass(frozen=True, slots=True)
class ToolCaller:
    tenant: str
    key: str  # the key's digest (hex), "" when unknown
    key_id: str | None  # a store key's id (an OAuth grant's "oauth:<client>:<subject>")
    tools: tuple[str, ...] | None = None  # an OAuth grant's globs (mcp.oauth.subjects): narrow the rest


class McpPolicy:
    def __init__(self, servers: list[McpServer], settings: McpSettings) -> None:
        self.servers = {s.name: s for s in servers}
        self._tenants = {a.tenant: a.tools for a in settings.access if a.tenant is not None}
        self._keys = {a.key.removeprefix("sha256:"): a.tools for a in settings.access if a.key is not None}
        self._limits = settings.limits

    def visible(self, who: ToolCaller, prefixed: str) -> bool:
        found = split_name(prefixed)
        if found is None:
            return False
        server = self.servers.get(found[0])
        if server is None or not server.exposes(found[1]):
            return False
        tenant = self._tenants.get(who.tenant)
        if tenant is not None and not allowed(tenant, prefixed):
            return False
        key = self._keys.get(who.key) if who.key else None
        if key is None and who.key_id:
            key = self._keys.get(who.key_id)
        if key is not None and not allowed(key, prefixed):
            return False
        return who.tools is None or allowed(list(who.tools), prefixed)

    def servers_for(self, who: ToolCaller) -> list[McpServer]:
        """The servers of which the caller may see anything: `notes__*`-style globs decide it."""
        return [s for s in self.servers.values() if self._may_reach(who, s.name)]

    def _may_reach(self, who: ToolCaller, server: str) -> bool:
        for globs in (self._tenants.get(who.tenant), self._keys.get(who.key) if who.key else None,
                      list(who.tools) if who.tools is not None else None):
            if globs is not None and not any(_may_match(g, server) for g in globs):
                return False
        return True

    def charges(self, who: ToolCaller, server: str, prefixed: str) -> list[Charge]:
        """The token buckets of one call (one request each), per the `mcp.limits` rules that match."""
        out = []
        key = who.key_id or (who.key[:12] if who.key else "")
        for rule in self._limits:
            value = {"tenant": who.tenant, "key": key, "server": server, "tool": prefixed}[rule.scope]
            if value and (rule.match == "*" or allowed([rule.match], value)):
                out.append(_charge(rule, value))
        return out


def _may_match(glob: str, server: str) -> bool:
    """Could `glob` match some tool of `server`? (`notes__*`: yes for notes; `*`: for any.)"""
    head, sep, _ = glob.partition(SEPARATOR)
    return allowed([head], server) if sep else glob.endswith("*") and allowed([glob], server + SEPARATOR)


def _charge(rule: McpLimit, value: str) -> Charge:
    # The bucket's scope label: a server's and a tool's buckets are upstream-side ones, as a cluster's.
    scope: BucketScope = "key" if rule.scope == "key" else "tenant" if rule.scope == "tenant" else "cluster"
    return Charge(f"mcp:{rule.scope}:{rule.match}:{value}", scope, "requests", BucketParams.of(rule.rate, rule.burst),
                  NANO)
