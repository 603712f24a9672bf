"""The Grafana dashboard's shape: unique panel ids, no overlapping panels, every query on the
datasource variable and covering every series the issue asks to see. Its queries are run against a
real Prometheus in test_prometheus_live.py."""

from __future__ import annotations

import json

from tests.stack_config import ROOT

DASHBOARD = json.loads((ROOT / "deploy/grafana/dashboards/modelyard.json").read_text())


def test_panels_have_unique_ids_and_do_not_overlap() -> None:
    panels = DASHBOARD["panels"]
    assert len({p["id"] for p in panels}) == len(panels)
    cells: set[tuple[int, int]] = set()
    for p in panels:
        g = p["gridPos"]
        assert g["x"] >= 0 and g["x"] + g["w"] <= 24, p["title"]
        mine = {(x, y) for x in range(g["x"], g["x"] + g["w"]) for y in range(g["y"], g["y"] + g["h"])}
        assert not mine & cells, f"{p['title']} overlaps another panel"
        cells |= mine


def test_every_query_uses_the_datasource_variable_and_the_series_needed() -> None:
    targets = [t for p in DASHBOARD["panels"] for t in p.get("targets", [])]
    assert all(t["datasource"]["uid"] == "${datasource}" for t in targets)
    assert len({t["expr"] for t in targets}) == len(targets)
    exprs = "\n".join(t["expr"] for t in targets)
    for series in ("modelyard_requests_total", "modelyard_errors_total", "modelyard_request_duration_seconds_bucket",
                   "modelyard_time_to_first_token_seconds_bucket", "modelyard_tenant_tokens_total",
                   "modelyard_cost_total", "modelyard_extproc_open_streams", "modelyard_ratelimit_decisions_total",
                   "modelyard_channel_requests_total", "modelyard:gpu_watermark:max", "modelyard_batch_size_bucket",
                   "modelyard:ratelimit_degraded:max", "modelyard:watermark_age_seconds", "envoy_http_downstream_rq_xx",
                   "modelyard_queue_depth", "modelyard_queue_wait_seconds_bucket", "modelyard_inflight",
                   "modelyard_budget_spent_usd", "modelyard_budget_used_ratio", "modelyard_budget_refused_total",
                   "modelyard_budget_soft_crossings_total", "modelyard_response_cache_requests_total",
                   "modelyard_response_cache_saved_usd_total", "modelyard_response_cache_lookup_seconds_bucket",
                   "modelyard_deployment_cost_total", "modelyard_arm_calls_total", "modelyard_arm_cost_total",
                   "modelyard_arm_reward_total", "modelyard_bandit_arm", "modelyard_bandit_picks_total",
                   "modelyard_breaker_state", "modelyard_breaker_trips_total"):
        assert series in exprs, series
