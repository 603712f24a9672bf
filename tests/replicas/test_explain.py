"""`modelyard route explain` with the replica pick: the board's state as the extproc's /metrics
shows it, replayed by the picker for the deployment the request would go to."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest
from prometheus_client import CollectorRegistry, generate_latest

from contracts.config import load_config
from extproc.replicas.board import ReplicaBoard
from extproc.replicas.explain import add_replica_picks, explain_main, live_states
from extproc.replicas.readings import ReplicaReading
from extproc.routing.explain import format_replicas
from extproc.telemetry.metrics import ReplicaStates

ROOT = Path(__file__).resolve().parents[2]
A, B = "127.0.0.1:8121", "127.0.0.1:8122"


def _metrics(board: ReplicaBoard) -> str:
    states = ReplicaStates()
    states.source = board.states
    registry = CollectorRegistry()
    registry.register(states)
    return generate_latest(registry).decode()


def _board(now: float) -> ReplicaBoard:
    config = load_config(ROOT / "modelyard.yaml")
    board = ReplicaBoard(list(config.clusters().values()), clock=lambda: now)
    rs = board.sets["demo-vllm"]
    rs.readings[A] = ReplicaReading(40, 2, 0.5, now - 0.02)
    rs.readings[B] = ReplicaReading(0, 1, 0.1, now - 0.03, frozenset({"sql-lora"}), 2)
    rs.in_flight[B] = 3
    return board


def test_the_board_state_round_trips_through_metrics_text() -> None:
    live = live_states(_metrics(_board(100.0)))
    fields, loras = live[("demo-vllm", B)]
    assert fields == {"in_flight": 3, "waiting": 0, "running": 1, "kv_usage": 0.1, "max_lora": 2,
                      "age_seconds": pytest.approx(0.03)}
    assert loras == {"sql-lora"}
    assert live[("demo-vllm", A)][0]["waiting"] == 40


def test_explain_shows_each_replicas_terms_and_the_pick(capsys: pytest.CaptureFixture[str],
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    text = _metrics(_board(100.0))
    monkeypatch.setattr("extproc.routing.explain._live_metrics", lambda config: text)
    argv = ["--config", str(ROOT / "modelyard.yaml"), "--model", "demo-llama", "--tenant", "demo", "--live"]
    assert explain_main([*argv, "--json"]) == 0
    doc = orjson.loads(capsys.readouterr().out)
    (row,) = [r for r in doc["rows"] if r["rank"] == 1]
    p = row["replicas"]
    assert (p["endpoint"], p["why"]) == (B, "queue")
    by_ep = {r["endpoint"]: r for r in p["ranked"]}
    assert by_ep[B]["queue_len"] == 1 + 3  # running + the gateway's own calls in flight
    assert by_ep[A]["queue_len"] == 42 and by_ep[A]["kv_cache"] == 0.5
    assert by_ep[B]["in_flight"] == 3 and by_ep[B]["age_ms"] == 30
    assert explain_main(argv) == 0
    out = capsys.readouterr().out
    assert f"replicas of demo-vllm (weights queue=1 kv_cache=0.5 prefix=0 lora=0.5): -> {B} (queue)" in out
    assert "left out" not in out


def test_without_live_readings_envoy_balances_and_a_held_replica_is_named() -> None:
    config = load_config(ROOT / "modelyard.yaml")
    doc = {"rows": [{"rank": 1, "model": "demo-llama", "cluster": "demo-vllm"}]}
    add_replica_picks(config, doc, "", 100.0)
    p = doc["rows"][0]["replicas"]
    assert p["endpoint"] is None and p["why"] == "stale"
    assert {r["why"] for r in p["left_out"]} == {"no reading"}
    board = _board(100.0)
    board.sets["demo-vllm"].failed_at[B] = 99.5
    doc = {"rows": [{"rank": 1, "model": "demo-llama", "cluster": "demo-vllm"}]}
    add_replica_picks(config, doc, _metrics(board), 100.0)
    p = doc["rows"][0]["replicas"]
    assert (p["endpoint"], p["why"]) == (A, "only")
    assert p["left_out"] == [{"endpoint": B, "why": "failed its last call"}]
    assert f"{B:<22} {'-':>6}  left out: failed its last call" in "\n".join(format_replicas("demo-vllm", p))
