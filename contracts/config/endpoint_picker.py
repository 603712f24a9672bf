"""`endpoint_picker:` the replica picker served as a Gateway API Inference Extension endpoint
picker (EPP) for one InferencePool (`modelyard epp`, docs/routing.md "Endpoint-picker mode").

It lives in modelyard.yaml for the embedded default, or alone in its own file (a Kubernetes
ConfigMap): `modelyard epp --config FILE` takes the section, or the whole file when it has none.
"""

from __future__ import annotations

import re
from pathlib import Path

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from contracts.config.balancing import ReplicaMetrics
from contracts.errors import ConfigError

_IP_PORT = re.compile(r"^(\d{1,3}(\.\d{1,3}){3}|\[[0-9A-Fa-f:.]+\]):\d{1,5}$")


def check_endpoint(ep: str) -> str:
    """`ip:port` as the protocol wants it: Envoy's original-destination cluster dials the address as is."""
    ep = ep.strip()
    if not _IP_PORT.match(ep):
        raise ValueError(f"{ep!r}: want ip:port (an InferencePool's endpoints are pod addresses)")
    return ep


class KubernetesSource(BaseModel):
    """Pool membership and objectives from the Kubernetes API: the InferencePool named by `pool`
    (its selector and target ports), then a list+watch of the pods it selects and of the
    InferenceObjectives naming it (extproc/epp/kubeapi.py). Inside a pod every field may stay
    unset: the service account's token, CA and namespace, and $KUBERNETES_SERVICE_HOST/PORT."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    namespace: str | None = None  # default: the service account's namespace
    # A kubeconfig file (its current context: server, CA, token or client certificate) instead of
    # the in-cluster service account; `api_server` alone (plain http) is for a local stand-in.
    kubeconfig: str | None = None
    api_server: str | None = None
    pool_api: str = "inference.networking.k8s.io/v1"  # group/version of the InferencePool
    objectives_api: str | None = "inference.networking.x-k8s.io/v1alpha2"  # None: no InferenceObjective watch
    watch_timeout_s: int = Field(300, ge=1, le=3600)  # the server ends each watch by then; resumed from its version
    backoff_max_s: float = Field(30.0, gt=0)


class EndpointPickerConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    pool: str = Field(pattern=r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$")  # the InferencePool's name
    address: str = "127.0.0.1:9002"  # the ext_proc gRPC port (the Inference Extension's default 9002)
    metrics_address: str | None = None  # Prometheus /metrics, when set
    # `modelyard up` only: an Envoy listener (host:port) in front of the pool, configured as the
    # Inference Extension documents its gateway (controlplane/inference_pool.py), and this picker started.
    listener: str | None = None
    # Pool membership: a static list, and/or a file of `ip:port` lines re-read when it changes (what a
    # Kubernetes pod watch would keep current; $MODELYARD_EPP_ENDPOINTS adds to both).
    endpoints: list[str] = Field(default_factory=list)
    endpoints_file: str | None = None
    kubernetes: KubernetesSource | None = None  # the pool's pods and objectives from the cluster's API
    replica_metrics: ReplicaMetrics = ReplicaMetrics(kind="vllm")
    # Shedding (the protocol's 429): a request whose objective's priority is below 0 is sheddable, and
    # is refused when every candidate waits over `shed_queue` requests (or its KV cache is over `shed_kv`).
    shed_queue: float | None = Field(5.0, ge=0)
    shed_kv: float | None = Field(None, gt=0, le=1)
    # InferenceObjective name -> priority; a request names one in `x-gateway-inference-objective`.
    objectives: dict[str, int] = Field(default_factory=dict)
    default_priority: int = 0
    # The next best endpoints after the pick, for a proxy that retries down the list (override-host).
    fallbacks: int = Field(0, ge=0, le=8)
    max_body_bytes: int = Field(16 * 1024 * 1024, ge=1024)

    _endpoints = field_validator("endpoints")(lambda eps: [check_endpoint(e) for e in eps])


ENDPOINTS_ENV = "MODELYARD_EPP_ENDPOINTS"


def parse_endpoints(text: str) -> list[str]:
    """Pool membership as a file or variable holds it: `ip:port` separated by commas, spaces or
    lines (`#` starts a comment), or a JSON list; each once, in order."""
    text = text.strip()
    if text.startswith("["):
        items = yaml.safe_load(text)
        if not isinstance(items, list) or not all(isinstance(i, str) for i in items):
            raise ValueError("want a list of \"ip:port\" strings")
    else:
        items = [w for line in text.splitlines() for w in line.split("#", 1)[0].replace(",", " ").split()]
    return list(dict.fromkeys(check_endpoint(i) for i in items))


def load_endpoint_picker(path: str | Path | None, **overrides: object) -> EndpointPickerConfig:
    """The `endpoint_picker:` section of a modelyard.yaml, or a file that is only that section;
    `overrides` (the command line's, None: not given) replace its fields. No file: flags alone."""
    data: dict[str, object] = {}
    if path is not None:
        try:
            loaded = yaml.safe_load(Path(path).read_text()) or {}
        except (OSError, yaml.YAMLError) as e:
            raise ConfigError(f"{path}: {e}") from None
        if not isinstance(loaded, dict):
            raise ConfigError(f"{path}: want a mapping")
        section = loaded.get("endpoint_picker", loaded if "pool" in loaded else None)
        if not isinstance(section, dict):
            raise ConfigError(f"{path}: no endpoint_picker section")
        data = dict(section)
    data.update({k: v for k, v in overrides.items() if v is not None})
    try:
        return EndpointPickerConfig.model_validate(data)
    except ValidationError as e:
        where = "; ".join(f"endpoint_picker.{'.'.join(map(str, err['loc']))}: {err['msg']}" for err in e.errors())
        raise ConfigError(where) from None
