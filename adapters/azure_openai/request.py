"""Azure OpenAI requests: OpenAI's body, the deployment in the path, api-version in the query."""

from __future__ import annotations

from collections.abc import Mapping
from urllib.parse import quote

from adapters import openai
from adapters.cloud_targets import AzureTarget
from adapters.fields import header
from adapters.internal import ChatRequest, RenderOptions, UpstreamRequest
from contracts.errors import UpstreamError

__all__ = ["CLIENT_AUTH_HEADERS", "deployment_path", "parse_request", "request_target", "render_request",
           "client_api_key", "check_query", "passthrough_body",
           "unsupported_controls"]

# Azure's own key header: a client's must never reach an upstream (the flow strips these).
CLIENT_AUTH_HEADERS: tuple[str, ...] = ("api-key",)

# Clients of Azure speak OpenAI's request body; the demo upstream parses with it.
parse_request = openai.parse_request
# OpenAI's query rules and same-protocol body (stream usage switched on) hold for Azure's callers too.
check_query = openai.check_query
passthrough_body = openai.passthrough_body
unsupported_controls = openai.unsupported_controls


def deployment_path(deployment: str, api_version: str) -> str:
    return (f"/openai/deployments/{quote(deployment, safe='')}/chat/completions"
            f"?api-version={quote(api_version, safe='')}")


def _target(options: RenderOptions | None) -> AzureTarget:
    cloud = options.cloud if options is not None else None
    if not isinstance(cloud, AzureTarget):
        # Config validation requires `azure:`; reaching here is the gateway's fault, not the caller's.
        raise UpstreamError("azure-openai deployment has no `azure:` settings")
    return cloud


def _headers(target: AzureTarget, credential: str | None) -> dict[str, str]:
    headers = {"content-type": "application/json"}
    if credential:
        if target.auth == "entra":
            headers["authorization"] = "Bearer " + credential
        else:
            headers["api-key"] = credential
    return headers


def request_target(req: ChatRequest, *, upstream_model: str, credential: str | None,
                   options: RenderOptions | None = None) -> tuple[str, dict[str, str]]:
    """Path and headers: `upstream_model` is the Azure deployment name."""
    target = _target(options)
    return deployment_path(upstream_model, target.api_version), _headers(target, credential)


def render_request(req: ChatRequest, *, upstream_model: str, credential: str | None,
                   options: RenderOptions | None = None) -> UpstreamRequest:
    target = _target(options)
    # Azure takes max_completion_tokens (reasoning deployments refuse max_tokens) unless told otherwise.
    body = openai.render_request(req, upstream_model=upstream_model, credential=None, options=options).body
    return UpstreamRequest(deployment_path(upstream_model, target.api_version), _headers(target, credential), body)


def client_api_key(headers: Mapping[str, str], query: Mapping[str, str]) -> str | None:
    """The caller's credential as Azure reads it: `api-key`, else `Authorization: Bearer`."""
    key = header(headers, "api-key")
    if key:
        return key.strip() or None
    return openai.client_api_key(headers, query)
