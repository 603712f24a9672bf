"""What the learning strategy learns from a finished call (extproc/accounting.py): the arm's own answer
earns its reward, a failover to a peer is the arm's failure, a spill or a call the upstream never
answered teaches nothing; the shipped demo-learn is routed by the bandit with its propensity."""

from __future__ import annotations

import yaml

from contracts.config import parse_config
from extproc.accounting import Accountant
from extproc.admission.choice import Choice
from extproc.admission.dispatch import Dispatcher
from extproc.context import RequestContext
from extproc.routing import RouteRequest, Scheduler
from tests.core.session_driver import ROOT
from tests.stack_config import without_watermarks

KEY = ("demo-learn", "standard", "")


def _parts() -> tuple[Scheduler, Accountant, Dispatcher]:
    cfg = parse_config(without_watermarks(yaml.safe_load((ROOT / "modelyard.yaml").read_text())))
    s = Scheduler(cfg)
    return s, Accountant(s), Dispatcher(s)


def _finish(acc: Accountant, choice: Choice, ok: bool | None, latency_s: float = 0.01) -> None:
    ctx = RequestContext(task_id="t1", method="POST", path="/v1/chat/completions", query={}, headers={})
    acc.record_outcome(ctx, choice, status=200 if ok is not False else 502, upstream_ok=ok, latency_s=latency_s,
                       ttft_s=None, usage=None)


def _evidence(s: Scheduler, arm: str) -> tuple[float, float]:
    e = s.bandit.evidence.get(KEY, {}).get(arm)
    return (0.0, 0.0) if e is None else (round(e.wins, 3), round(e.losses, 3))


def test_the_shipped_bandit_routes_demo_learn_with_a_propensity() -> None:
    s, _, dispatcher = _parts()
    tenant = next(t for t in s.config.tenants if t.name == "demo")
    choice = dispatcher.choose(RouteRequest("demo-learn", tenant, task_id="x"))
    assert choice.strategy == "adaptive" and choice.arm == choice.deployment.cluster
    assert choice.arm in ("demo-learn-a", "demo-learn-b") and 0.05 <= (choice.propensity or 0) <= 0.95
    assert ("x-modelyard-arm", choice.arm) in choice.response_headers()


def test_what_each_outcome_teaches() -> None:
    s, acc, _ = _parts()
    model = next(m for m in s.config.models if m.name == "demo-learn")
    a, b = model.deployments

    def chosen(**kw) -> Choice:
        return Choice(model=model, deployment=a, strategy="adaptive", arm=a.cluster, propensity=0.5, **kw)

    _finish(acc, chosen(), True)  # the arm answered itself, fast: nearly a full win
    w, lo = _evidence(s, "demo-learn-a")
    assert w > 0.9 and lo < 0.1
    failover = chosen()
    failover.deployment = b  # Envoy's retry: b answered the call a was chosen for
    _finish(acc, failover, True)
    assert _evidence(s, "demo-learn-a")[1] > lo + 0.99 and _evidence(s, "demo-learn-b") == (0.0, 0.0)
    before = _evidence(s, "demo-learn-a")
    _finish(acc, chosen(), None)  # the client left: nothing
    spilled = chosen(spilled_from=("demo-learn-a",))
    spilled.deployment = b  # our own limit moved it from a to b: nothing
    _finish(acc, spilled, True)
    assert _evidence(s, "demo-learn-a") == before and _evidence(s, "demo-learn-b") == (0.0, 0.0)


async def test_feedback_on_an_adaptive_call_feeds_its_arm(tmp_path) -> None:
    """POST /v1/feedback's flow: the score of a call the bandit routed is learned for the arm it chose."""
    import orjson

    from extproc.flows import feedback
    from extproc.gateway import Gateway
    from extproc.telemetry.metering import MeteringStore, MeterRecord

    data = without_watermarks(yaml.safe_load((ROOT / "modelyard.yaml").read_text()))
    data["routing"]["adaptive"]["reward"] = {"success": 1, "latency": 0, "cost": 0, "feedback": 2}
    cfg = parse_config(data)
    store = MeteringStore(tmp_path / "metering.sqlite")
    gw = Gateway.build(cfg, metering=store)
    try:
        store.record(MeterRecord(1.0, "task-1", "demo", "L1", "demo-learn", "demo-learn-b", "standard", 200, 10.0,
                                 None, 1, 1, 0.0, "adaptive", "demo-learn-a", None, 0, 0, 0, 0.0, 0, 0.5))
        ctx = RequestContext(task_id="fb", method="POST", path="/v1/feedback", query={}, headers={})
        ctx.tenant = next(t for t in cfg.tenants if t.name == "demo")
        await feedback.record(gw, ctx, orjson.dumps({"task_id": "task-1", "score": 0.25}))
        s = gw.dispatcher.scheduler
        # weight feedback / (success + latency + cost) = 2 calls: wins 0.5, losses 1.5, on the arm it chose
        assert _evidence(s, "demo-learn-a") == (0.5, 1.5) and _evidence(s, "demo-learn-b") == (0.0, 0.0)
    finally:
        store.close()
