"""The pure per-deployment queue: slots, tier priority, fair shares across tenants, refusals."""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from contracts.config.queueing import QueueSettings
from extproc.routing.queueing import DeploymentQueue, Ticket

TIERS = ("L1", "L2", "L3")


def _queue(max_inflight: int = 1, **kw: object) -> DeploymentQueue:
    return DeploymentQueue(max_inflight, QueueSettings.model_validate(kw))


def _offer(q: DeploymentQueue, tenant: str, tier: str = "L3", now: float = 0.0) -> Ticket:
    t = Ticket(tenant, tier, now)  # type: ignore[arg-type]
    assert q.offer(t, now) is None
    return t


def _drain(q: DeploymentQueue, holder: Ticket, now: float = 1.0) -> list[Ticket]:
    """Release slot after slot, holder first: the order the waiters got their slot."""
    order = []
    nxt = q.release(holder, now)
    while nxt is not None:
        order.append(nxt)
        nxt = q.release(nxt, now)
    return order


def test_a_free_slot_is_granted_at_once_and_the_rest_wait() -> None:
    q = _queue(2)
    a, b, c = (_offer(q, "t") for _ in range(3))
    assert (a.state, b.state, c.state) == ("granted", "granted", "waiting")
    assert q.inflight == 2 and q.waiting() == 1
    assert q.release(a, 0.5) is c and c.state == "granted" and c.granted_at == 0.5
    assert q.inflight == 2 and q.waiting() == 0


def test_l1_goes_before_l2_before_l3_whatever_the_arrival() -> None:
    q = _queue(1)
    holder = _offer(q, "x", "L3")
    l3 = [_offer(q, "a", "L3") for _ in range(3)]
    l2 = _offer(q, "b", "L2")
    l1 = _offer(q, "c", "L1")
    assert _drain(q, holder) == [l1, l2, *l3]


def test_two_tenants_alternate_however_many_one_queued_first() -> None:
    q = _queue(1, bound=100, tenant_share=1.0)
    holder = _offer(q, "x")
    flood = [_offer(q, "a") for _ in range(10)]
    late = [_offer(q, "b") for _ in range(3)]
    order = [t.tenant for t in _drain(q, holder)]
    # b's first request goes second: behind one of a's, not behind all ten.
    assert order[:7] == ["a", "b", "a", "b", "a", "b", "a"]
    assert order.count("a") == 10 and order.count("b") == 3
    assert flood[-1].state == late[-1].state == "released"


def test_each_tenant_is_served_in_its_own_arrival_order() -> None:
    q = _queue(1, bound=100, tenant_share=1.0)
    holder = _offer(q, "x")
    mine = [_offer(q, "a") for _ in range(5)]
    for _ in range(5):
        _offer(q, "b")
    assert [t for t in _drain(q, holder) if t.tenant == "a"] == mine


def test_full_tier_queue_is_503_and_a_tenants_own_share_429() -> None:
    q = _queue(1, bound={"L3": 4}, tenant_share=0.5)
    _offer(q, "x")
    _offer(q, "a")
    _offer(q, "a")
    over_share = q.offer(Ticket("a", "L3", 0.0), 0.0)
    assert over_share is not None and over_share.status == 429 and over_share.reason == "tenant_share"
    _offer(q, "b")
    _offer(q, "c")
    full = q.offer(Ticket("d", "L3", 0.0), 0.0)
    assert full is not None and full.status == 503 and full.retry_after_s >= 1
    # Another tier has its own bound.
    _offer(q, "d", "L1")


def test_withdrawn_ticket_is_skipped_and_release_is_idempotent() -> None:
    q = _queue(1)
    holder = _offer(q, "x")
    gone, stays = _offer(q, "a"), _offer(q, "b")
    assert q.withdraw(gone) and not q.withdraw(gone)
    assert q.release(holder, 1.0) is stays
    assert q.release(holder, 1.0) is None  # a second release of the same slot hands nothing back
    assert q.inflight == 1
    assert not q.withdraw(stays)  # already granted: the caller must release it instead


def test_zero_bound_means_no_queue() -> None:
    q = _queue(1, bound={"L3": 0})
    _offer(q, "x")
    r = q.offer(Ticket("a", "L3", 0.0), 0.0)
    assert r is not None and r.status == 503


def test_retry_after_follows_the_observed_hold_time() -> None:
    q = _queue(1, bound={"L3": 1})
    t = _offer(q, "x", now=0.0)
    for i in range(30):  # every request holds its slot for 4 s
        q.release(t, i * 4.0 + 4.0)
        t = _offer(q, "x", now=i * 4.0 + 4.0)
    _offer(q, "a")
    r = q.offer(Ticket("b", "L3", 0.0), 0.0)
    assert r is not None and 6 <= r.retry_after_s <= 9  # two requests ahead at ~4 s each


# -- properties ----------------------------------------------------------------------------

_op = st.one_of(
    st.tuples(st.just("offer"), st.sampled_from("abcd"), st.sampled_from(TIERS)),
    st.tuples(st.just("release"), st.integers(0, 1000), st.just("")),
    st.tuples(st.just("withdraw"), st.integers(0, 1000), st.just("")),
)


@settings(max_examples=300, deadline=None)
@given(ops=st.lists(_op, max_size=120), max_inflight=st.integers(1, 4), bound=st.integers(0, 8),
       share=st.sampled_from([0.25, 0.5, 1.0]))
def test_no_request_is_lost_duplicated_or_served_out_of_order(ops, max_inflight, bound, share) -> None:
    q = DeploymentQueue(max_inflight, QueueSettings(bound=dict.fromkeys(TIERS, bound), tenant_share=share))
    tickets: list[Ticket] = []
    grants: list[Ticket] = []
    now = 0.0
    for kind, who, tier in ops:
        now += 1.0
        waiting_before = [t for t in tickets if t.state == "waiting"]
        if kind == "offer":
            t = Ticket(who, tier, now)  # type: ignore[arg-type]
            refusal = q.offer(t, now)
            tickets.append(t)
            if refusal is not None:
                assert t.state == "refused"
                if refusal.status == 503:
                    assert q.waiting(tier) >= bound  # type: ignore[arg-type]
                else:
                    assert q.waiting_for(who, tier) >= q.settings.tenant_cap(tier)  # type: ignore[arg-type]
            elif t.state == "granted":
                assert not waiting_before  # nobody jumped: a free slot is only taken when none wait
                grants.append(t)
        elif kind == "release":
            held = [t for t in tickets if t.state == "granted"]
            if not held:
                continue
            nxt = q.release(held[who % len(held)], now)
            if nxt is not None:
                grants.append(nxt)
                # The best waiter went: no one of a higher tier waited, nor one of its tier with a smaller tag.
                for w in waiting_before:
                    assert TIERS.index(w.tier) >= TIERS.index(nxt.tier)
                    if w.tier == nxt.tier:
                        assert (w.start_tag, w.seq) >= (nxt.start_tag, nxt.seq)
            else:
                assert not waiting_before
        else:
            waiting = [t for t in tickets if t.state == "waiting"]
            if waiting:
                assert q.withdraw(waiting[who % len(waiting)])
        states = Counter(t.state for t in tickets)
        assert q.inflight == states["granted"] <= max_inflight
        assert q.waiting() == states["waiting"]
        if states["waiting"]:
            assert q.inflight == max_inflight  # a slot never idles while someone waits
        for tier_ in TIERS:
            assert q.waiting(tier_) <= bound
    assert len(grants) == len({id(t) for t in grants})  # granted once each
    # Each tenant's requests of one tier got their slots in arrival order.
    for tenant in "abcd":
        for tier_ in TIERS:
            seqs = [t.seq for t in grants if t.tenant == tenant and t.tier == tier_]
            assert seqs == sorted(seqs)


@settings(max_examples=100, deadline=None)
@given(backlog=st.lists(st.integers(1, 30), min_size=2, max_size=5), max_inflight=st.integers(1, 3))
def test_backlogged_tenants_share_slots_equally(backlog, max_inflight) -> None:
    """Tenants with queued work get slots round robin: while all still wait, counts differ by at most one."""
    q = DeploymentQueue(max_inflight, QueueSettings(bound=dict.fromkeys(TIERS, 1000), tenant_share=1.0))
    holders = [_offer(q, "holder") for _ in range(max_inflight)]
    names = [f"t{i}" for i in range(len(backlog))]
    for name, n in zip(names, backlog):
        for _ in range(n):
            _offer(q, name)
    served: Counter[str] = Counter()
    held = list(holders)
    while held:
        nxt = q.release(held.pop(0), 1.0)
        if nxt is None:
            continue
        served[nxt.tenant] += 1
        held.append(nxt)
        still = [n for n, b in zip(names, backlog) if served[n] < b]
        if len(still) >= 2:
            counts = [served[n] for n in still]
            assert max(counts) - min(counts) <= 1, served
    assert served == Counter(dict(zip(names, backlog)))


@pytest.mark.parametrize("ratio", [10, 100])
def test_a_flooding_tenant_delays_a_light_one_by_one_request_at_most(ratio: int) -> None:
    q = _queue(1, bound=10_000, tenant_share=1.0)
    holder = _offer(q, "x")
    for _ in range(ratio):
        _offer(q, "flood")
    light = _offer(q, "light")
    order = _drain(q, holder)
    assert order.index(light) <= 1
