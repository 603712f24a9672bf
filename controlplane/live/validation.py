"""A config text offered for apply: parsed with the loader every command uses, checked against
what only a restart can change, and built into its snapshot, before anything changes."""

from __future__ import annotations

from dataclasses import dataclass

from contracts.config import GatewayConfig
from contracts.errors import ConfigError
from contracts.live_config import config_version
from controlplane.environments import EnvironmentConfig
from controlplane.live.config_text import parse_text
from controlplane.live.snapshot import Snapshot, build_snapshot


@dataclass(frozen=True)
class Candidate:
    text: bytes
    version: str
    cfg: GatewayConfig
    snapshot: Snapshot


def restart_only(old: GatewayConfig, new: GatewayConfig) -> list[str]:
    """Settings a running gateway cannot take: Envoy's bootstrap holds the ext_proc cluster and
    the control plane's address, the worker processes hold their ports, and Envoy never moves a
    listener to another address."""
    changed = []
    if old.extproc.address != new.extproc.address:
        changed.append("extproc.address")
    if old.extproc.workers != new.extproc.workers:
        changed.append("extproc.workers")
    if old.extproc.unix_socket != new.extproc.unix_socket:
        changed.append("extproc.unix_socket")
    if old.extproc.unix_socket_server != new.extproc.unix_socket_server:  # the workers' servers are built at start
        changed.append("extproc.unix_socket_server")
    if old.listener != new.listener:
        changed.append("listener")
    if old.controlplane != new.controlplane:
        changed.append("controlplane")
    return changed


def candidate(text: bytes, env: EnvironmentConfig, running: GatewayConfig | None, source: str = "<apply>") -> Candidate:
    """CPU work (pydantic, the Envoy resources): run it off the event loop."""
    cfg = parse_text(text, source)
    if running is not None and (fixed := restart_only(running, cfg)):
        raise ConfigError(f"{source}: {', '.join(fixed)} cannot change on a running gateway "
                          "(restart it with the new file)")
    version = config_version(text)
    return Candidate(text, version, cfg, build_snapshot(cfg, env, version))
