import pytest

from contracts.config.routing import DEFAULT_STRATEGIES, parse_routing_settings


def test_empty_section_gives_defaults():
    for data in (None, {}):
        s = parse_routing_settings(data)
        assert set(s.strategies) == {"cost", "speed", "quality", "balanced"}
        assert s.saturation_threshold == 0.9
        assert s.admission["L1"].max_watermark is None
        assert s.admission["L2"].max_watermark == 0.7
        assert s.admission["L3"].max_watermark == 0.4
        assert s.admission["L3"].trial_per_minute == 10
        assert s.watermarks.interval_s == 1.0
        assert s.watermarks.stale_after_s == 3.0
        assert s.ab.share_b == 0.0


def test_overrides_merge_with_defaults():
    s = parse_routing_settings(
        {
            "strategies": {"mine": {"cost": 1}, "cost": {"cost": 2, "quality": 2}},
            "admission": {"L3": {"max_watermark": 0.3}},
            "ab": {"share_b": 0.25, "weights_b": {"balanced": {"quality": 1}}},
            "watermarks": {"interval_s": 0.5, "stale_after_intervals": 4},
        }
    )
    assert s.strategies["speed"] == DEFAULT_STRATEGIES["speed"]
    assert s.strategies["cost"].normalised() == (0.5, 0.0, 0.5, 0.0)
    assert "mine" in s.strategies
    # A tier entry changes only the keys it names.
    assert s.admission["L3"].max_watermark == 0.3 and s.admission["L3"].trial_per_minute == 10
    assert s.watermarks.stale_after_s == 2.0


@pytest.mark.parametrize(
    "data, path",
    [
        ({"cooldown": {"failures": 0}}, "routing.cooldown.failures"),
        ({"cooldown": {"windw_s": 3}}, "routing.cooldown.windw_s"),
        ({"strategies": {"x": {"quality": 0}}}, "routing.strategies.x"),
        ({"strategies": {"x": {"quality": -1}}}, "routing.strategies.x.quality"),
        ({"ab": {"share_b": 1.5}}, "routing.ab.share_b"),
        ({"ab": {"weights_b": {"nope": {"quality": 1}}}}, "ab.weights_b.nope"),
        ({"admission": {"L4": {}}}, "routing.admission.L4"),
        ({"admission": {"L2": {"max_watermark": 2}}}, "routing.admission.L2.max_watermark"),
        ({"saturation_threshold": 0}, "routing.saturation_threshold"),
        ({"watermarks": {"interval_s": 0}}, "routing.watermarks.interval_s"),
        ([1, 2], "routing"),
    ],
 ids=[
    "cooldown-failures-0", "misspelt-cooldown-key", "strategy-all-zero", "strategy-negative", "ab-share-over-1",
    "ab-unknown-weight", "unknown-tier", "max_watermark-over-1", "saturation-0", "watermark-interval-0",
    "not-a-mapping"
])
def test_errors_name_the_key_path(data, path):
    with pytest.raises(ValueError) as e:
        parse_routing_settings(data)
    assert path in str(e.value)
