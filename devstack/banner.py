"""What `modelyard up` prints once the stack serves: drawn from the config it runs, nothing assumed.

The demo key is shown only when a tenant of this config accepts it (the shipped modelyard.yaml);
any other config's keys exist here only as digests, so the banner names a placeholder instead.
"""

from __future__ import annotations

import hmac
import shlex

import orjson

from contracts.config import GatewayConfig, hash_api_key

DEMO_KEY = "sk-modelyard-demo"  # public: its digest ships in modelyard.yaml for the demo tenants
KEY_PLACEHOLDER = "$MODELYARD_API_KEY"
DEMO_ADMIN_KEY = "adm-modelyard-demo"  # public: the shipped config's admin key, for the console (README)


def accepts_demo_key(cfg: GatewayConfig) -> bool:
    digest = hash_api_key(DEMO_KEY)
    return any(hmac.compare_digest(k, digest) for t in cfg.tenants for k in t.api_keys)


def try_command(cfg: GatewayConfig, url: str) -> str:
    """A request that works against this config: a chat with its first chat model, else the model list."""
    key = DEMO_KEY if accepts_demo_key(cfg) else KEY_PLACEHOLDER
    auth = f"-H \"Authorization: Bearer {key}\""
    chat = next((m for m in cfg.models if "chat" in m.task_types), None)
    if chat is None:
        return f"curl {url}/v1/models {auth}"
    body = orjson.dumps({"model": chat.name, "messages": [{"role": "user", "content": "hello"}]}).decode()
    return (f"curl {url}/v1/chat/completions {auth} \\\n         -H 'content-type: application/json' "
            f"-d {shlex.quote(body)}")


def banner(cfg: GatewayConfig, *, url: str, run_dir: str, admin_url: str | None,
           demo_upstreams: list[str]) -> str:
    lines = ["", "Modelyard is up.",
             f"  Gateway (OpenAI, Anthropic, Gemini, KServe v2): {url}"]
    if accepts_demo_key(cfg):
        lines.append(f"  Demo API key:   {DEMO_KEY}")
    else:
        lines.append(f"  API key:        one of your tenants' keys (below as {KEY_PLACEHOLDER})")
    lines.append(f"  Models:         {', '.join(m.name for m in cfg.models)}")
    if cfg.mcp_servers:
        lines.append(f"  MCP servers:    {', '.join(s.name for s in cfg.mcp_servers)} as one, at {url}/mcp (docs/mcp.md)")
        if cfg.mcp.oauth is not None:
            lines.append(f"  MCP OAuth:      bearer tokens from {cfg.mcp.oauth.issuer} beside the keys (docs/mcp.md)")
    if cfg.guardrails.policies:
        covers = [f"{p.name} ({', '.join([*p.applies_to.tenants, *p.applies_to.keys, *p.applies_to.models, *p.applies_to.tools])})"
                  for p in cfg.guardrails.policies]
        lines.append(f"  Guardrails:     {'; '.join(covers)} (docs/guardrails.md)")
    if demo_upstreams:
        lines.append(f"  Demo upstreams: {', '.join(demo_upstreams)} (started here)")
    if cfg.extproc.metrics_address:
        lines.append(f"  Metrics:        http://{cfg.extproc.metrics_address}/metrics")
    if admin_url:
        lines.append(f"  Envoy admin:    {admin_url}")
    if cfg.console.enabled and cfg.keys.admin_keys:
        who = DEMO_ADMIN_KEY if hash_api_key(DEMO_ADMIN_KEY) in cfg.keys.admin_keys else "an admin key of keys.admin_keys"
        lines.append(f"  Console:        {url}/console (sign in with {who}; docs/console.md)")
    if cfg.controlplane.enabled:
        lines.append(f"  Live config:    edit the config, then `modelyard apply` (control plane "
                     f"http://{cfg.controlplane.api_address}; `modelyard status`)")
    epp = cfg.endpoint_picker
    if epp is not None and epp.listener:
        lines.append(f"  InferencePool:  http://{epp.listener} ({epp.pool}: Envoy + `modelyard epp` on {epp.address}, "
                     "the Inference Extension's protocol; docs/routing.md)")
        if epp.kubernetes is not None and cfg.devstack.demo_kube_api is not None:
            lines.append(f"  Pool's pods:    watched at {epp.kubernetes.api_server} (the demo Kubernetes API; "
                         "POST /demo/pods/NAME {\"ready\": false})")
    lines.append(f"  Logs:           {run_dir}")
    lines.append(f"  Try: {try_command(cfg, url)}")
    lines.append("Ctrl-C stops everything.")
    return "\n".join(lines)
