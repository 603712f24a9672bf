"""OAuth resource-server decisions that need no network: the metadata URL (RFC 9728 3.1), which
subject rule names the tenant, scopes in either claim shape, what counts as a JWT, and the
algorithms config refuses."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from contracts.config.mcp import McpOAuth, McpOAuthSubject
from extproc.mcp.oauth import (
    Grant,
    TokenVerifier,
    looks_like_jwt,
    match_subject,
    metadata_paths,
    metadata_url,
    token_scopes,
)

BASE = {"resource": "https://gw.example/mcp", "issuer": "https://as.example/", "jwks_url": "https://as.example/jwks"}


def test_metadata_url_inserts_the_well_known_path() -> None:
    assert metadata_url("https://gw.example/mcp") == "https://gw.example/.well-known/oauth-protected-resource/mcp"
    assert metadata_url("http://127.0.0.1:10000/") == "http://127.0.0.1:10000/.well-known/oauth-protected-resource"
    assert metadata_paths("https://gw.example/mcp") == ("/.well-known/oauth-protected-resource/mcp",
                                                       "/.well-known/oauth-protected-resource")


def test_the_first_matching_subject_rule_names_the_tenant() -> None:
    rules = [McpOAuthSubject(client="ci-*", tenant="ci", tools=["notes__*"]),
             McpOAuthSubject(subject="alice", tenant="team-a"), McpOAuthSubject(tenant="everyone", tools=[])]
    assert match_subject(rules, "ci-42", "alice").tenant == "ci"  # type: ignore[union-attr]
    assert match_subject(rules, "web", "alice").tenant == "team-a"  # type: ignore[union-attr]
    assert match_subject(rules, "web", "bob").tenant == "everyone"  # type: ignore[union-attr]
    assert match_subject(rules[:2], "web", "bob") is None
    v = TokenVerifier(McpOAuth(**BASE, subjects=rules))
    grant = Grant("ci-42", "alice", "ci", ("notes__*",), ("mcp",))
    assert grant.key_id == "oauth:ci-42:alice" and v.tools_of(grant.key_id) == ("notes__*",)
    assert v.tools_of("sk-store-key-id") is None and v.tools_of(None) is None


def test_scopes_and_jwt_shapes() -> None:
    assert token_scopes({"scope": "mcp tools:read"}) == ("mcp", "tools:read")
    assert token_scopes({"scp": ["mcp"]}) == ("mcp",) and token_scopes({}) == ()
    assert looks_like_jwt("eyJ.eyJ.sig") and not looks_like_jwt("sk-modelyard-demo") and not looks_like_jwt("a.b")


def test_challenge_names_the_metadata_and_the_error() -> None:
    v = TokenVerifier(McpOAuth(**BASE))
    assert v.challenge() == ("www-authenticate", 'Bearer resource_metadata='
                             '"https://gw.example/.well-known/oauth-protected-resource/mcp", scope="mcp"')
    e = v.refused(403, "insufficient_scope", 'lacks "mcp"')
    assert e.status == 403 and e.headers[0][1].endswith('error="insufficient_scope", error_description="lacks \'mcp\'"')


@pytest.mark.parametrize("algs", [["HS256"], ["none"], []])
def test_symmetric_or_no_algorithms_are_refused(algs: list[str]) -> None:
    with pytest.raises(ValidationError, match="asymmetric"):
        McpOAuth(**BASE, algorithms=algs)
