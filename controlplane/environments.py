"""Envoy environments: `envoy/environments/NAME.yaml`, what differs between dev, staging and prod
(admin exposure, timeouts, access log, concurrency, retries, extproc replicas, Envoy's RLS)."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from extproc.config import ConfigError

ENVIRONMENTS_DIR = Path(__file__).resolve().parent.parent / "envoy" / "environments"


class _Env(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class AdminSettings(_Env):
    address: str = "127.0.0.1"
    port: int = Field(9901, ge=0, le=65535)


class TimeoutSettings(_Env):
    route_s: float = Field(300.0, ge=0)
    connect_s: float = Field(2.0, gt=0)
    extproc_message_s: float = Field(10.0, gt=0)
    stream_idle_s: float = Field(300.0, ge=0)


class AccessLogSettings(_Env):
    path: str = "/dev/stdout"
    format: Literal["text", "json"] = "text"


class RateLimitServiceSettings(_Env):
    """Wires Envoy's native ratelimit filter to Modelyard's RLS (served on the extproc port)."""

    domain: str = "modelyard"
    timeout_s: float = Field(0.5, gt=0)
    failure_mode_deny: bool = False


class ListenerOverride(_Env):
    address: str | None = None
    port: int | None = Field(None, ge=0, le=65535)


class EnvironmentConfig(_Env):
    name: str
    admin: AdminSettings | None = AdminSettings()
    concurrency: int = Field(2, ge=1, le=256)
    timeouts: TimeoutSettings = TimeoutSettings()
    buffer_limit_bytes: int = Field(32 * 1024 * 1024, ge=1024)
    access_log: AccessLogSettings | None = None
    listener: ListenerOverride = ListenerOverride()
    # Several extproc replicas behind one Envoy: list them here; default is config's extproc.address.
    extproc_endpoints: list[str] = Field(default_factory=list)
    retries: int = Field(1, ge=0, le=5)
    rate_limit_service: RateLimitServiceSettings | None = None


def load_environment(name: str, directory: Path | None = None) -> EnvironmentConfig:
    path = (directory or ENVIRONMENTS_DIR) / f"{name}.yaml"
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except OSError:
        known = sorted(p.stem for p in (directory or ENVIRONMENTS_DIR).glob("*.yaml"))
        raise ConfigError(f"{path}: no such environment (known: {', '.join(known)})") from None
    except yaml.YAMLError as e:
        raise ConfigError(f"{path}: not valid YAML ({e})") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping at the top level")
    try:
        return EnvironmentConfig.model_validate({"name": name, **data})
    except ValidationError as e:
        msg = "; ".join(".".join(str(p) for p in err["loc"]) + ": " + err["msg"] for err in e.errors())
        raise ConfigError(f"{path}: {msg}") from None
