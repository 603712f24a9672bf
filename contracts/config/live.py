"""The control plane: the one source of the running config for Envoy (over ADS) and for every
extproc worker and replica (over the long-poll in contracts/live_config.py)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class ControlPlaneConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    enabled: bool = False  # off: a static bootstrap, and SIGHUP reloads as before
    xds_address: str = "127.0.0.1:18000"  # ADS (gRPC) for Envoy
    api_address: str = "127.0.0.1:18001"  # HTTP: apply, status, and the extprocs' config long-poll
