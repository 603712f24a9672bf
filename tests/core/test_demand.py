"""The demand signals' collector (extproc/telemetry/demand.py): what it reads at scrape time."""

from __future__ import annotations

from extproc.telemetry.demand import Demand, Load


def _values(d: Demand) -> dict[tuple[str, str], float]:
    return {(f.name, s.labels["cluster"]): s.value for f in d.collect() for s in f.samples}


def test_idle_counts_from_start_then_from_the_last_call_and_is_zero_while_busy() -> None:
    now = [1000.0]
    d = Demand(clock=lambda: now[0])
    loads = {"a": Load(0, 0, 4)}
    d.clusters = lambda: iter(["a", "b"])
    d.loads = lambda: loads
    now[0] = 1030.0
    v = _values(d)
    assert v[("modelyard_deployment_idle_seconds", "a")] == 30 == v[("modelyard_deployment_idle_seconds", "b")]
    assert v[("modelyard_deployment_last_request_timestamp_seconds", "b")] == 1000
    assert v[("modelyard_deployment_max_inflight", "a")] == 4 and v[("modelyard_deployment_utilization", "a")] == 0
    assert ("modelyard_deployment_max_inflight", "b") not in v  # no max_inflight: no capacity to report

    d.touch("a")
    loads["a"] = Load(4, 6, 4)
    now[0] = 1100.0
    v = _values(d)
    assert v[("modelyard_deployment_idle_seconds", "a")] == 0  # calls hold or wait for its slots
    assert v[("modelyard_deployment_utilization", "a")] == 2.5
    assert v[("modelyard_deployment_last_request_timestamp_seconds", "a")] == 1030

    loads["a"] = Load(0, 0, 4)
    d.touch("a")
    now[0] = 1105.0
    assert _values(d)[("modelyard_deployment_idle_seconds", "a")] == 5


def test_nothing_configured_yet_yields_empty_families() -> None:
    assert [f.samples for f in Demand().collect()] == [[], [], [], []]
