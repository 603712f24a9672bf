"""What the endpoint picker reads of the cluster's objects, pure:

- an InferencePool (inference.networking.k8s.io/v1: `spec.selector.matchLabels`,
  `spec.targetPorts[].number`; v1alpha2's `spec.selector` map and `spec.targetPortNumber` too);
- a Pod is a replica while it is Running, Ready (its `Ready` condition True), has a podIP and is
  not being deleted (no `deletionTimestamp`), the reference picker's test; its endpoints are
  podIP:port for each of the pool's target ports;
- an InferenceObjective (inference.networking.x-k8s.io/v1alpha2) gives `spec.priority` (unset: 0)
  to requests naming it (`x-gateway-inference-objective`), when its `spec.poolRef.name` is the pool.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from contracts.config.endpoint_picker import check_endpoint


class PoolError(ValueError):
    """An InferencePool the picker cannot serve (no selector, no port)."""


@dataclass(frozen=True, slots=True)
class PoolSpec:
    selector: tuple[tuple[str, str], ...]  # matchLabels, sorted
    ports: tuple[int, ...]

    def label_selector(self) -> str:
        """The list/watch `labelSelector` parameter."""
        return ",".join(f"{k}={v}" for k, v in self.selector)

    def selects(self, pod: Mapping[str, Any]) -> bool:
        labels = (pod.get("metadata") or {}).get("labels") or {}
        return all(labels.get(k) == v for k, v in self.selector)


def read_pool(pool: Mapping[str, Any]) -> PoolSpec:
    spec = pool.get("spec") or {}
    sel = spec.get("selector") or {}
    labels = sel.get("matchLabels") if isinstance(sel.get("matchLabels"), Mapping) else sel
    if not isinstance(labels, Mapping) or not labels or not all(isinstance(v, str) for v in labels.values()):
        raise PoolError("InferencePool has no spec.selector.matchLabels")
    raw: list[Any] = [p.get("number") for p in spec.get("targetPorts") or [] if isinstance(p, Mapping)]
    if not raw and spec.get("targetPortNumber") is not None:  # v1alpha2
        raw = [spec["targetPortNumber"]]
    ports = [p for p in raw if isinstance(p, int) and not isinstance(p, bool) and 0 < p < 65536]
    if not ports or len(ports) != len(raw):
        raise PoolError("InferencePool has no valid spec.targetPorts")
    return PoolSpec(tuple(sorted((str(k), v) for k, v in labels.items())), tuple(dict.fromkeys(ports)))


def pod_ready(pod: Mapping[str, Any]) -> bool:
    meta, status = pod.get("metadata") or {}, pod.get("status") or {}
    if meta.get("deletionTimestamp") or status.get("phase") != "Running" or not status.get("podIP"):
        return False
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in status.get("conditions") or []
               if isinstance(c, Mapping))


def pod_endpoints(pod: Mapping[str, Any], pool: PoolSpec) -> list[str]:
    """The pod's `ip:port` per target port while it counts as a replica; none otherwise."""
    if not pool.selects(pod) or not pod_ready(pod):
        return []
    ip = str(pod["status"]["podIP"])
    host = f"[{ip}]" if ":" in ip else ip
    try:
        return [check_endpoint(f"{host}:{port}") for port in pool.ports]
    except ValueError:
        return []  # not an IP address: never a replica


def pool_endpoints(pods: Iterable[Mapping[str, Any]], pool: PoolSpec) -> list[str]:
    """Every ready pod's endpoints, in a stable order (pod name), each once."""
    ordered = sorted(pods, key=lambda p: ((p.get("metadata") or {}).get("name") or ""))
    return list(dict.fromkeys(ep for pod in ordered for ep in pod_endpoints(pod, pool)))


def objective_priorities(objectives: Iterable[Mapping[str, Any]], pool: str) -> dict[str, int]:
    """InferenceObjective name -> priority, for the objectives whose poolRef names this pool."""
    out: dict[str, int] = {}
    for obj in objectives:
        name = (obj.get("metadata") or {}).get("name")
        spec = obj.get("spec") or {}
        ref = spec.get("poolRef") or {}
        if not name or ref.get("name") != pool or ref.get("kind", "InferencePool") != "InferencePool":
            continue
        prio = spec.get("priority")
        out[str(name)] = prio if isinstance(prio, int) and not isinstance(prio, bool) else 0
    return out
