import orjson

from contracts.config import load_config
from contracts.watermarks import Reading
from extproc.routing import RouteRequest, Scheduler
from extproc.routing.explain import explain, explain_main, format_explain
from tests.stack_config import ROOT

CONFIG = str(ROOT / "modelyard.yaml")


def test_explain_table(capsys):
    assert explain_main(["--config", CONFIG, "--model", "auto", "--tenant", "demo", "--strategy", "cost"]) == 0
    out = capsys.readouterr().out
    assert "-> demo-openai-mini on the standard channel" in out
    assert "demo-openai-fast" in out and "filtered: fast channel not requested" in out


def test_explain_json_filters_and_fast(capsys):
    argv = ["--config", CONFIG, "--tenant", "demo-l2", "--fast", "--tools", "--prompt-tokens", "9000",
            "--watermark", "demo-openai-fast=0.8", "--json"]
    assert explain_main(argv) == 0
    doc = orjson.loads(capsys.readouterr().out)
    assert doc["chosen"] == "demo-openai" and doc["channel"] == "standard" and doc["downgraded"]
    reasons = {r["cluster"]: r.get("filtered") for r in doc["rows"]}
    assert "exceeds context window 8192" in reasons["demo-openai-mini"]
    assert reasons["demo-openai-fast"] == "fast channel closed to L2 at watermark 0.80"


def test_explain_errors(capsys):
    assert explain_main(["--config", CONFIG, "--tenant", "demo-l3", "--model", "demo-claude"]) == 1
    assert "404" in capsys.readouterr().out
    assert explain_main(["--config", CONFIG, "--tenant", "nobody"]) == 2
    assert explain_main(["--config", "/nonexistent.yaml"]) == 2


def test_explain_does_not_spend_quota():
    cfg = load_config(CONFIG)
    s = Scheduler(cfg)
    l3 = next(t for t in cfg.tenants if t.name == "demo-l3")
    marks = {c: Reading(0.0, 0.0) for c in cfg.clusters()}
    for _ in range(20):
        doc = explain(s, RouteRequest("demo-gpt", l3, want_fast=True), 0.0, marks)
    assert doc["channel"] == "fast" and "demo-openai-fast" in format_explain(doc)


def test_explain_shows_the_strategy_tolerances():
    cfg = load_config(CONFIG)
    l1 = next(t for t in cfg.tenants if t.tier == "L1")
    doc = explain(Scheduler(cfg), RouteRequest("auto", l1), 0.0, {c: Reading(0.0, 0.0) for c in cfg.clusters()})
    assert set(doc["weights"]) == {"quality", "latency", "cost", "load"}
    assert doc["tolerance"] == {"latency": 1.0, "latency_ms": 10.0, "cost": 0.5}
    assert "latency scaled over max(spread, 100% of the fastest, 10 ms); cost over max(spread, 50% of the cheapest)" \
        in format_explain(doc)


def test_explain_reads_queue_state_from_metrics_text():
    from extproc.routing.explain import queue_states

    cfg = load_config(CONFIG)
    text = "\n".join([
        "# TYPE modelyard_inflight gauge",
        'modelyard_inflight{cluster="demo-openai-mini"} 4.0',
        "# TYPE modelyard_queue_depth gauge",
        'modelyard_queue_depth{cluster="demo-openai-mini",model="demo-mini",tier="L1"} 0.0',
        'modelyard_queue_depth{cluster="demo-openai-mini",model="demo-mini",tier="L3"} 100.0',
        'modelyard_queue_depth{cluster="demo-openai",model="demo-gpt",tier="L3"} 7.0',  # no limit there
    ]) + "\n"
    queues = queue_states(cfg, text)
    assert set(queues) == {"demo-openai-mini", "demo-cold"}  # the shipped deployments with max_inflight
    q = queues["demo-openai-mini"]
    assert (q.inflight, q.waiting["L3"], q.occupancy) == (4, 100, 26.0)
    assert q.outlook("L3") == "refused: the L3 queue is full (503)"
    assert q.outlook("L1") == "waits: 0 ahead of it in tiers up to L1"
    s = Scheduler(cfg)
    l3 = next(t for t in cfg.tenants if t.name == "demo-l3")
    marks = {c: Reading(0.0, 0.0) for c in cfg.clusters()}
    doc = explain(s, RouteRequest("demo-mini", l3), 0.0, marks, queues)
    assert doc["queue"] == "refused: the L3 queue is full (503)"
    assert doc["rows"][0]["terms"]["load"] == 0.0  # a full queue reads as full load
    assert "4/4 in flight, waiting L1=0/100 L2=0/100 L3=100/100" in format_explain(doc)
