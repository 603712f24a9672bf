"""Demand signals per deployment for autoscalers (KEDA, HPA through prometheus-adapter; docs/deploy.md).

The queue's own series (modelyard_queue_depth, _queue_wait_seconds, _inflight, _queue_refused_total,
_spilled_total) live in metrics.py and are kept by extproc/admission/concurrency.py and dispatch.py.
What an autoscaler needs besides is read here at scrape time, never stale:

- `modelyard_deployment_max_inflight{cluster}`: the slots a deployment has (its capacity per gateway
  process), so `inflight / max_inflight` and the queue can be read against it;
- `modelyard_deployment_utilization{cluster}`: (in flight + waiting) / max_inflight; above 1 callers wait;
- `modelyard_deployment_last_request_timestamp_seconds{cluster}` and `modelyard_deployment_idle_seconds{cluster}`:
  when a call last reached or left the deployment (the process's start before any), and the seconds since
  (0 while a call holds or waits for one of its slots): what lets an autoscaler scale it to zero.

The request path only stamps a time in a dict (`touch`); everything else runs in the scrape thread.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass

from prometheus_client import REGISTRY
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector


@dataclass(frozen=True, slots=True)
class Load:
    """One limited deployment's slots now: in flight, waiting, and how many it has."""

    inflight: int
    waiting: int
    max_inflight: int


class Demand(Collector):
    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self.clock = clock
        self.started = clock()
        self.last: dict[str, float] = {}  # cluster -> wall time a call last reached or left it
        self.clusters: Callable[[], Iterator[str]] | None = None  # every configured deployment (composition root)
        self.loads: Callable[[], Mapping[str, Load]] | None = None  # the limited ones' slots

    def touch(self, cluster: str) -> None:
        """A call reached or left `cluster` (routed to it, or answered)."""
        self.last[cluster] = self.clock()

    def idle_seconds(self, cluster: str, load: Load | None, now: float) -> float:
        if load is not None and (load.inflight or load.waiting):
            return 0.0
        return max(0.0, now - self.last.get(cluster, self.started))

    def collect(self) -> Iterator[GaugeMetricFamily]:
        cap = GaugeMetricFamily("modelyard_deployment_max_inflight",
                                "Slots a deployment has on this gateway process (its max_inflight)", labels=["cluster"])
        util = GaugeMetricFamily("modelyard_deployment_utilization",
                                 "(in flight + waiting) / max_inflight: above 1 callers wait", labels=["cluster"])
        last = GaugeMetricFamily("modelyard_deployment_last_request_timestamp_seconds",
                                 "Unix time a call last reached or left a deployment (the process's start before any)",
                                 labels=["cluster"])
        idle = GaugeMetricFamily("modelyard_deployment_idle_seconds",
                                 "Seconds since a call last reached or left a deployment; 0 while one holds or "
                                 "waits for a slot (scale to zero on this)", labels=["cluster"])
        now = self.clock()
        loads = dict(self.loads()) if self.loads is not None else {}
        for cluster in (self.clusters() if self.clusters is not None else ()):
            load = loads.get(cluster)
            if load is not None:
                cap.add_metric([cluster], float(load.max_inflight))
                util.add_metric([cluster], (load.inflight + load.waiting) / load.max_inflight)
            last.add_metric([cluster], self.last.get(cluster, self.started))
            idle.add_metric([cluster], self.idle_seconds(cluster, load, now))
        yield from (cap, util, last, idle)


DEMAND = Demand()
REGISTRY.register(DEMAND)
