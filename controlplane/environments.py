"""Envoy environments: `envoy/environments/NAME.yaml`, what differs between dev, staging and prod
(admin exposure, timeouts, access log, concurrency, retries, extproc replicas, Envoy's RLS, and the
edge: client address trust, slow-client timeouts, connection limits, the overload manager)."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from contracts.errors import ConfigError

ENVIRONMENTS_DIR = Path(__file__).resolve().parent.parent / "envoy" / "environments"


class _Env(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class AdminSettings(_Env):
    address: str = "127.0.0.1"
    port: int = Field(9901, ge=0, le=65535)
    # A unix socket path (mode 0600) instead of a TCP port: only local processes of Envoy's user reach it.
    pipe: str | None = None


class TimeoutSettings(_Env):
    route_s: float = Field(300.0, ge=0)
    connect_s: float = Field(2.0, gt=0)
    extproc_message_s: float = Field(10.0, gt=0)
    stream_idle_s: float = Field(300.0, ge=0)


class AccessLogSettings(_Env):
    path: str = "/dev/stdout"
    format: Literal["text", "json"] = "text"


class EdgeSettings(_Env):
    """The listener's downstream side: whom to believe about the client's address, how long a
    client may take to send a request, and how much one connection may hold."""

    # Envoy sets X-Forwarded-For from the peer address; with proxies in front, trust that many hops.
    use_remote_address: bool = True
    xff_num_trusted_hops: int = Field(0, ge=0, le=10)
    # Slow-loris: the whole header block must arrive within this, from its first byte.
    request_headers_timeout_s: float = Field(10.0, gt=0)
    # The whole request (headers, body, the extproc's work on it) until it goes upstream; the timer
    # stops when the response starts, so it never cuts a stream. 0 turns it off.
    request_timeout_s: float = Field(60.0, ge=0)
    # A connection with no request in flight is closed after this.
    idle_timeout_s: float = Field(300.0, gt=0)
    max_requests_per_connection: int = Field(1000, ge=1)
    # Open downstream connections, all listeners together (Envoy's overload manager enforces it).
    max_connections: int = Field(10_000, ge=1)


class OverloadSettings(_Env):
    """Envoy's overload manager on a fixed heap budget: shrink the heap, then refuse new requests."""

    max_heap_bytes: int = Field(1024 * 1024 * 1024, ge=64 * 1024 * 1024)
    shrink_heap_at: float = Field(0.90, gt=0, le=1)
    stop_accepting_requests_at: float = Field(0.95, gt=0, le=1)

    @model_validator(mode="after")
    def _ordered(self) -> OverloadSettings:
        if self.shrink_heap_at >= self.stop_accepting_requests_at:
            raise ValueError("shrink_heap_at must be below stop_accepting_requests_at")
        return self


class ExtprocTlsSettings(_Env):
    """Envoy -> extproc over TLS (mTLS with a client certificate), for replicas on other hosts."""

    ca_file: str
    cert_file: str | None = None
    key_file: str | None = None
    server_name: str | None = None  # the name in the extproc's certificate, when not the endpoint host

    @model_validator(mode="after")
    def _pair(self) -> ExtprocTlsSettings:
        if bool(self.cert_file) != bool(self.key_file):
            raise ValueError("cert_file and key_file go together (both or neither)")
        return self


class RateLimitServiceSettings(_Env):
    """Wires Envoy's native ratelimit filter to Modelyard's RLS (served on the extproc port)."""

    domain: str = "modelyard"
    timeout_s: float = Field(0.5, gt=0)
    failure_mode_deny: bool = False


class StatsSettings(_Env):
    """A listener that serves only GET /stats/prometheus from the admin interface (controlplane/stats_listener.py)."""

    address: str = "0.0.0.0"
    port: int = Field(9902, ge=1, le=65535)


Encoding = Literal["gzip", "br", "zstd"]
_ALL_ENCODINGS: tuple[Encoding, ...] = ("gzip", "br", "zstd")


class CompressionSettings(_Env):
    """Request bodies in these encodings are inflated by Envoy before the extproc reads them; answers
    are compressed in `response_encodings` (first preferred) for clients that accept one."""

    request_encodings: list[Encoding] = Field(default_factory=lambda: list(_ALL_ENCODINGS))
    response_encodings: list[Encoding] = Field(default_factory=list)
    min_response_bytes: int = Field(256, ge=0)


class ListenerOverride(_Env):
    address: str | None = None
    port: int | None = Field(None, ge=0, le=65535)


class EnvironmentConfig(_Env):
    name: str
    admin: AdminSettings | None = AdminSettings()
    # Envoy's Prometheus stats for scrapers on other hosts, without opening the rest of admin.
    stats: StatsSettings | None = None
    concurrency: int = Field(2, ge=1, le=256)
    timeouts: TimeoutSettings = TimeoutSettings()
    buffer_limit_bytes: int = Field(32 * 1024 * 1024, ge=1024)
    access_log: AccessLogSettings | None = None
    listener: ListenerOverride = ListenerOverride()
    # Several extproc replicas behind one Envoy: list them here; default is config's extproc.address.
    extproc_endpoints: list[str] = Field(default_factory=list)
    extproc_tls: ExtprocTlsSettings | None = None
    retries: int = Field(1, ge=0, le=5)
    rate_limit_service: RateLimitServiceSettings | None = None
    edge: EdgeSettings = EdgeSettings()
    overload: OverloadSettings = OverloadSettings()
    compression: CompressionSettings = CompressionSettings()

    @model_validator(mode="after")
    def _stats_need_admin(self) -> EnvironmentConfig:
        if self.stats and not self.admin:
            raise ValueError("stats proxies the admin interface: set admin (a loopback port or a pipe)")
        return self

    @model_validator(mode="after")
    def _request_outlives_extproc(self) -> EnvironmentConfig:
        # Headers and body each get one extproc message; a shorter request timeout cuts allowed work.
        if self.edge.request_timeout_s and self.edge.request_timeout_s <= 2 * self.timeouts.extproc_message_s:
            raise ValueError("edge.request_timeout_s must be 0 or above twice timeouts.extproc_message_s")
        return self


def load_environment(name: str, directory: Path | None = None) -> EnvironmentConfig:
    """`name` is a shipped environment (envoy/environments/NAME.yaml) or a path to one's file
    (anything ending in .yaml or .yml), so an operator's environment need not live in this tree."""
    if name.endswith((".yaml", ".yml")):
        path = Path(name)
        name = path.stem
    else:
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
        msg = "; ".join((".".join(str(p) for p in err["loc"]) or "<root>") + ": " + err["msg"] for err in e.errors())
        raise ConfigError(f"{path}: {msg}") from None
