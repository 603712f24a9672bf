"""The control plane's /metrics: the running version (an info-style gauge with the version as a
label), what each Envoy and worker runs, applies by result, Envoy's refusals. Read at scrape time."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import CollectorRegistry, CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from controlplane.live.applier import LiveConfig


class _LiveCollector(Collector):
    def __init__(self, live: LiveConfig) -> None:
        self.live = live

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        st = self.live.status()
        # The extprocs export the same series from their /metrics: one name for the running version everywhere.
        info = GaugeMetricFamily("modelyard_config_info", "The config version the control plane runs",
                                 labels=["version"])
        info.add_metric([st["version"]], 1)
        yield info
        envoy = GaugeMetricFamily("modelyard_controlplane_envoy_config_info", "The config version each Envoy accepted",
                                  labels=["node", "stream", "version"])
        for s in st["envoy"]["streams"]:
            envoy.add_metric([s["node"], str(s["stream"]), s["version"] or ""], 1)
        yield envoy
        workers = GaugeMetricFamily("modelyard_controlplane_worker_config_info",
                                    "The config version each extproc worker runs", labels=["worker", "version"])
        for w in st["workers"]:
            workers.add_metric([w["worker"], w["version"]], 1)
        yield workers
        applies = CounterMetricFamily("modelyard_controlplane_applies", "Applies by result", labels=["result"])
        for result, n in sorted(self.live.counts.applies.items()):
            applies.add_metric([result], n)
        yield applies
        nacks = CounterMetricFamily("modelyard_controlplane_envoy_nacks", "Configs Envoy refused")
        nacks.add_metric([], self.live.counts.nacks)
        yield nacks


def registry(live: LiveConfig) -> CollectorRegistry:
    reg = CollectorRegistry()
    reg.register(_LiveCollector(live))
    return reg
