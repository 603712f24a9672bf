"""Properties of the pure bucket math."""

from fractions import Fraction

from hypothesis import given, settings
from hypothesis import strategies as st

from ratelimit import bucket
from ratelimit.bucket import NANO, BucketParams, BucketState

params_st = st.builds(
    BucketParams,
    rate_milli=st.integers(1, 5_000_000),
    burst_nano=st.integers(1, 1000).map(lambda b: b * NANO // 4),
)
arrivals_st = st.lists(
    st.tuples(st.integers(0, 3_000_000), st.integers(0, 400).map(lambda c: c * NANO // 8)), min_size=1, max_size=80
)


def _run(params: BucketParams, arrivals: list[tuple[int, int]]) -> list[tuple[int, int, bool, BucketState]]:
    t = 10**12
    st_ = bucket.full(params, t)
    out = []
    for gap, cost in arrivals:
        t += gap
        ok, st_, _ = bucket.try_take(st_, params, cost, t)
        out.append((t, cost, ok, st_))
    return out


@settings(max_examples=300, deadline=None)
@given(params_st, arrivals_st)
def test_admitted_cost_over_any_interval_is_bounded(params, arrivals):
    run = _run(params, arrivals)
    adm = [(t, c) for t, c, ok, _ in run if ok]
    for i in range(len(adm)):
        total = 0
        for j in range(i, len(adm)):
            total += adm[j][1]
            assert total <= params.rate_milli * (adm[j][0] - adm[i][0]) + params.burst_nano


@settings(max_examples=300, deadline=None)
@given(params_st, arrivals_st)
def test_matches_exact_rational_model_and_never_refuses_with_enough_tokens(params, arrivals):
    rate = Fraction(params.rate_milli, 1000)  # units per second
    burst = Fraction(params.burst_nano, NANO)
    level, last = burst, None
    for t, cost, ok, s in _run(params, arrivals):
        if last is not None:
            level = min(burst, level + rate * Fraction(t - last, 1_000_000))
        last = t
        c = Fraction(cost, NANO)
        assert ok == (level >= c)  # admitted exactly when enough tokens exist
        if ok:
            level -= c
        assert Fraction(s.level_nano, NANO) == level  # no drift, no rounding
        assert s.level_nano >= 0  # admission never goes negative


@settings(max_examples=200, deadline=None)
@given(params_st, st.integers(-(10**12), 10**12), st.lists(st.integers(0, 10**6), max_size=50))
def test_settling_in_steps_equals_settling_once(params, level, steps):
    level = max(-params.burst_nano, min(params.burst_nano, level))
    s0 = BucketState(level, 0)
    s = s0
    t = 0
    for dt in steps:
        t += dt
        s = bucket.settle(s, params, t)
    assert s.level_nano == bucket.settle(s0, params, t).level_nano


def test_exact_over_a_very_long_run():
    # 1.5 units/s, take 1.5 units every second for ~11.6 days of simulated seconds: level never moves.
    p = BucketParams.of(1.5, 10)
    s = BucketState(4 * NANO, 0)
    for i in range(1, 1_000_001):
        ok, s, _ = bucket.try_take(s, p, 3 * NANO // 2, i * 1_000_000)
        assert ok
    assert s.level_nano == 4 * NANO
    # a year idle from empty refills exactly to burst, and a microsecond adds exactly rate*1e-6
    s = bucket.settle(BucketState(0, 0), p, 365 * 86400 * 1_000_000)
    assert s.level_nano == 10 * NANO
    assert bucket.settle(BucketState(0, 0), p, 1).level_nano == 1500


def test_wait_and_reset():
    p = BucketParams.of(2, 4)
    assert bucket.wait_us(0, NANO, p) == 500_000
    assert bucket.wait_us(0, 5 * NANO, p) == -1  # more than burst: never
    assert bucket.reset_us(0, p) == 2_000_000
    assert bucket.reset_us(4 * NANO, p) == 0


def test_adjust_allows_debt_down_to_minus_burst_only():
    p = BucketParams.of(1, 3)
    s = bucket.adjust(BucketState(NANO, 0), p, -10 * NANO, 0)
    assert s.level_nano == -3 * NANO
    ok, _, wait = bucket.try_take(s, p, NANO, 0)
    assert not ok and wait == 4_000_000
    assert bucket.adjust(s, p, 100 * NANO, 0).level_nano == 3 * NANO


def test_clock_going_backwards_refills_nothing():
    p = BucketParams.of(1, 3)
    s = bucket.settle(BucketState(NANO, 1_000_000), p, 0)
    assert s == BucketState(NANO, 1_000_000)
