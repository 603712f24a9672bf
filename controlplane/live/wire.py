"""Names of the control plane's HTTP API beyond contracts/live_config.py's, which only the control
plane and `modelyard apply` use; light, so the CLI need not load aiohttp for them."""

from __future__ import annotations

# Set in the control plane's environment: an apply must carry it as a bearer token (`modelyard apply` sends it).
TOKEN_ENV = "MODELYARD_CONTROLPLANE_TOKEN"
# Who applied a config (the CLI sends user@host): the log, /v1/status, and the long poll's answer.
APPLIED_BY_HEADER = "x-modelyard-applied-by"
