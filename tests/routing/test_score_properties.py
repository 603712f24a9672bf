"""Property tests: the fast scoring path agrees with the plain formula over its own terms."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from contracts.watermarks import Reading
from extproc.routing import NoRoute, RouteRequest, Scheduler, parse_routing_settings

from .conftest import dep, make_config, model, tenant

NOW = 50.0

_model = st.fixed_dictionaries(
    {
        "quality": st.floats(0, 1),
        "latency_ms": st.floats(0, 5000),
        "cin": st.floats(0, 10),
        "cout": st.floats(0, 30),
        "ctx": st.integers(1, 10000),
        "tools": st.booleans(),
        "channels": st.lists(st.sampled_from(["standard", "fast"]), min_size=1, max_size=3),
    }
)


@settings(max_examples=200, deadline=None)
@given(
    models=st.lists(_model, min_size=1, max_size=6),
    marks=st.lists(st.floats(0, 1), min_size=18, max_size=18),
    strategy=st.sampled_from(["cost", "speed", "quality", "balanced"]),
    prompt=st.integers(0, 12000),
    tools=st.booleans(),
    want_fast=st.booleans(),
    tier=st.sampled_from(["L1", "L2", "L3"]),
    limit=st.integers(0, 4),
)
def test_scores_match_terms_and_order(models, marks, strategy, prompt, tools, want_fast, tier, limit):
    cfg = make_config(
        [
            model(
                f"m{i}",
                [dep(f"m{i}-{j}", channel=c) for j, c in enumerate(m["channels"])],
                groups=["g"],
                quality=m["quality"],
                latency_ms=m["latency_ms"],
                cost={"input_per_1k": m["cin"], "output_per_1k": m["cout"]},
                capabilities={"context_window": m["ctx"], "tools": m["tools"]},
            )
            for i, m in enumerate(models)
        ],
        tenants=[tenant("t", tier)],
    )
    s = Scheduler(cfg, parse_routing_settings({"max_candidates": limit}))
    readings = {c: Reading(marks[i], NOW) for i, c in enumerate(cfg.clusters())}
    req = RouteRequest("g", cfg.tenants[0], strategy, want_fast, prompt, needs_tools=tools)
    try:
        d = s.decide(req, NOW, readings, dry_run=True)
    except NoRoute as e:
        assert e.status in (400, 503) and e.rejected
        return
    w = dict(zip(("quality", "latency", "cost", "load"), s.settings.strategies[strategy].normalised()))
    total = sum(1 for _ in cfg.clusters())
    assert len(d.candidates) + len(d.rejected) <= total
    if limit:
        assert len(d.candidates) <= limit
    for c in d.candidates:
        t = c.terms
        expected = sum(w[k] * t[k] for k in w) * (1 - t["error_rate"])
        assert c.score == pytest.approx(expected, abs=1e-9)
        assert all(-1e-9 <= t[k] <= 1 + 1e-9 for k in w)
        assert c.model_config.capabilities.context_window >= prompt
        assert c.model_config.capabilities.tools or not tools
        assert c.channel == "standard" or want_fast or all(
            x.channel == "fast" for x in c.model_config.deployments
        )
    fast_flags = [c.fast_admitted for c in d.candidates]
    assert all(c.channel == "fast" and want_fast for c in d.candidates if c.fast_admitted)
    # Admitted fast candidates come first, each block best first.
    assert fast_flags == sorted(fast_flags, reverse=True)
    for flag in (True, False):
        block = [c.score for c, f in zip(d.candidates, fast_flags) if f is flag]
        assert block == sorted(block, reverse=True)
