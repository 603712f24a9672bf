"""`routing.output_limit`: a call asking more output tokens than a model's max_output_tokens."""

import pytest

from extproc.routing import BadRouteRequest, RouteRequest, Scheduler

from .conftest import dep, make_config, model


def test_output_limit_clamp_filters_while_a_model_can_give_it_and_else_keeps_them_all():
    models = [model("small", [dep("s1", monitored=False)], groups=["g"], quality=0.9,
                    capabilities={"max_output_tokens": 1024}),
              model("big", [dep("b1", monitored=False)], groups=["g"], quality=0.1,
                    capabilities={"max_output_tokens": 4096})]
    filtering = Scheduler(make_config(models))
    clamping = Scheduler(make_config(models, routing={"output_limit": "clamp"}))
    t = filtering.config.tenants[0]
    for s in (filtering, clamping):  # one model can give 2000: both policies send it there
        assert s.decide(RouteRequest("g", t, "quality", est_output_tokens=2000), 1, {}).chosen.model == "big"
    with pytest.raises(BadRouteRequest, match="over max_output_tokens"):
        filtering.decide(RouteRequest("g", t, "quality", est_output_tokens=8000), 1, {})
    d = clamping.decide(RouteRequest("g", t, "quality", est_output_tokens=8000), 1, {})
    assert d.chosen.model == "small" and d.rejected == ()  # none can: routed as usual, the flow clamps
