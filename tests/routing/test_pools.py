"""Dedicated pools, spot capacity under the cost strategy, a deployment's own price, and slot
occupancy read as load."""

from __future__ import annotations

import pytest

from contracts.config import parse_config
from contracts.errors import ConfigError
from extproc.routing import BadRouteRequest, RouteRequest, Scheduler

from .conftest import dep, make_config, model, tenant, tenant_of


def _pools():
    return make_config(
        [model("m", [dep("shared", monitored=False),
                     dep("gold", monitored=False, reserved_for={"tiers": ["L1"], "tenants": ["vip"]})],
               quality=0.5)],
        tenants=[tenant("l1", "L1"), tenant("l3", "L3"), tenant("vip", "L3")])


def test_dedicated_pool_serves_only_its_tiers_and_tenants() -> None:
    cfg = _pools()
    s = Scheduler(cfg)
    for name, reachable in (("l1", {"shared", "gold"}), ("vip", {"shared", "gold"}), ("l3", {"shared"})):
        d = s.decide(RouteRequest("m", tenant_of(cfg, name)), 0.0, {})
        assert {c.cluster for c in d.candidates} == reachable, name
    d = s.decide(RouteRequest("m", tenant_of(cfg, "l3")), 0.0, {})
    assert [(r.cluster, r.check) for r in d.rejected] == [("gold", "reserved")]


def test_a_model_only_in_a_dedicated_pool_refuses_others_as_a_client_error() -> None:
    cfg = make_config([model("m", [dep("gold", monitored=False, reserved_for={"tiers": ["L1"]})])],
                      tenants=[tenant("l3", "L3")])
    with pytest.raises(BadRouteRequest) as e:
        Scheduler(cfg).decide(RouteRequest("m", tenant_of(cfg, "l3")), 0.0, {})
    assert "reserved" in e.value.message and e.value.status == 400


def _spot(**spot_kw):
    return make_config(
        [model("m", [dep("on-demand", monitored=False),
                     dep("spot", monitored=False, spot=True, max_inflight=2, **spot_kw)],
               quality=0.5, cost={"input_per_1k": 1.0, "output_per_1k": 1.0})],
        tenants=[tenant("t", "L3", strategy="cost")])


def test_idle_spot_goes_first_under_the_cost_strategy_and_busy_spot_does_not() -> None:
    cfg = _spot()  # same price: only the spot rule puts it first
    s = Scheduler(cfg)
    req = RouteRequest("m", tenant_of(cfg, "t"))
    assert s.decide(req, 0.0, {}, occupancy={"spot": 0.5}).chosen.cluster == "spot"
    assert s.decide(req, 0.0, {}, occupancy={"spot": 1.5}).chosen.cluster == "on-demand"
    # Not a spot-first strategy: the equal scores fall back to config order.
    quality = RouteRequest("m", tenant_of(cfg, "t"), strategy_override="quality")
    assert s.decide(quality, 0.0, {}, occupancy={"spot": 0.0}).chosen.cluster == "on-demand"
    # A spot deployment that is gone is failed over like any other: the on-demand one is next in line.
    assert [c.cluster for c in s.decide(req, 0.0, {}).candidates] == ["spot", "on-demand"]


def test_a_deployments_own_cost_overrides_the_models() -> None:
    cfg = _spot(cost={"input_per_1k": 0.1, "output_per_1k": 0.1})
    s = Scheduler(cfg)
    d = s.decide(RouteRequest("m", tenant_of(cfg, "t"), strategy_override="balanced"), 0.0, {})
    terms = {c.cluster: c.terms for c in d.candidates}
    assert terms["spot"]["cost_est"] < terms["on-demand"]["cost_est"]
    assert terms["spot"]["cost"] == 1.0 and terms["on-demand"]["cost"] == 0.0


def test_occupancy_is_load() -> None:
    cfg = make_config([model("m", [dep("a", monitored=False, max_inflight=4), dep("b", monitored=False)])],
                      tenants=[tenant("t", "L1", strategy="speed")])
    s = Scheduler(cfg)
    req = RouteRequest("m", tenant_of(cfg, "t"))
    assert s.decide(req, 0.0, {}).chosen.cluster == "a"
    d = s.decide(req, 0.0, {}, occupancy={"a": 1.0})
    assert d.chosen.cluster == "b"
    assert {c.cluster: c.terms["load"] for c in d.candidates} == {"a": 0.0, "b": 1.0}


def test_config_errors_name_the_key() -> None:
    base = {"models": [{"name": "m", "deployments": [
        {"cluster": "c", "protocol": "openai", "endpoints": ["h:1"], "reserved_for": {}}]}],
        "tenants": [{"name": "t", "api_keys": ["0" * 64]}]}
    with pytest.raises(ConfigError, match="reserved_for"):
        parse_config(base)
    base["models"][0]["deployments"][0] = {"cluster": "c", "protocol": "openai", "endpoints": ["h:1"],
                                           "max_inflight": 0}
    with pytest.raises(ConfigError, match="max_inflight"):
        parse_config(base)
    base["models"][0]["deployments"][0] = {"cluster": "c", "protocol": "openai", "endpoints": ["h:1"],
                                           "max_inflight": 2, "queue": {"max_wait_s": {"L3": 0}}}
    with pytest.raises(ConfigError, match="max wait"):
        parse_config(base)
    with pytest.raises(ConfigError, match="spot_first"):
        parse_config({**base, "models": [{"name": "m", "deployments": [
            {"cluster": "c", "protocol": "openai", "endpoints": ["h:1"]}]}], "routing": {"spot_first": ["nope"]}})


def test_per_tier_values_accept_one_number_or_a_partial_mapping() -> None:
    from contracts.config.queueing import QueueSettings

    q = QueueSettings.model_validate({"bound": 10, "max_wait_s": {"L3": 2}})
    assert q.bound == {"L1": 10, "L2": 10, "L3": 10}
    assert q.max_wait_s == {"L1": 30.0, "L2": 20.0, "L3": 2.0}
    assert q.tenant_cap("L3") == 5
