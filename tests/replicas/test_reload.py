"""The picker's weights and settings on a live reload (extproc/live/reload.py): the next pick uses
them, and the replica board keeps its readings, in-flight counts and failure holds."""

from __future__ import annotations

import asyncio
import copy
from typing import Any

import yaml

from contracts.config import parse_config
from contracts.live_config import config_version
from extproc.gateway import Gateway, LiveGateway
from extproc.live.reload import Reloader
from extproc.replicas.board import ReplicaBoard
from extproc.replicas.readings import ReplicaReading
from tests.core.session_driver import ROOT
from tests.stack_config import without_watermarks

A, B = "127.0.0.1:8121", "127.0.0.1:8122"


def _data() -> dict[str, Any]:
    return without_watermarks(yaml.safe_load((ROOT / "modelyard.yaml").read_text()))


def _deployment(data: dict[str, Any]) -> dict[str, Any]:
    return next(d for m in data["models"] for d in m["deployments"] if d["cluster"] == "demo-vllm")


def test_new_weights_apply_to_the_next_pick_and_the_board_keeps_its_state() -> None:
    data = _data()
    config = parse_config(data)
    now = 50.0
    board = ReplicaBoard(list(config.clusters().values()), clock=lambda: now)
    live = LiveGateway(Gateway.build(config, replicas=board), config_version(yaml.safe_dump(data).encode()))
    rs = board.sets["demo-vllm"]
    rs.readings.update({A: ReplicaReading(0, 0, 0.9, now), B: ReplicaReading(8, 0, 0.0, now)})
    rs.prefix.record([b"h" * 16], A)
    sent = board.sent("demo-vllm", B, [])
    rs.failed_at["127.0.0.9:1"] = now  # any hold survives too
    assert board.pick("demo-vllm")[0].endpoint == A  # the queue weighs most: a's empty queue wins

    kv_first = copy.deepcopy(data)
    _deployment(kv_first)["replica_metrics"]["weights"] = {"queue": 0.1, "kv_cache": 1.0}
    out = asyncio.run(Reloader(live).apply_text(yaml.safe_dump(kv_first).encode(), source="test", origin="memory"))
    assert out.ok, out.error
    assert live.current.replicas is board and board.sets["demo-vllm"] is rs
    assert rs.settings.weights.kv_cache == 1.0
    pick = board.pick("demo-vllm")[0]
    assert (pick.endpoint, pick.why) == (B, "kv_cache")  # b's empty KV cache now decides
    assert rs.readings[A].kv_usage == 0.9 and rs.in_flight == {B: 1} and "127.0.0.9:1" in rs.failed_at
    assert len(rs.prefix) == 1  # same blocks: the prefix index stays
    board.done(sent, failed=False)
    assert rs.in_flight == {}

    reblocked = copy.deepcopy(kv_first)
    _deployment(reblocked)["replica_metrics"]["block_chars"] = 128
    assert asyncio.run(Reloader(live).apply_text(yaml.safe_dump(reblocked).encode(), source="test",
                                                 origin="memory")).ok
    assert len(rs.prefix) == 0 and A in rs.readings  # other blocks: the old hashes never match again

    moved = copy.deepcopy(reblocked)
    _deployment(moved)["endpoints"] = [A]
    assert asyncio.run(Reloader(live).apply_text(yaml.safe_dump(moved).encode(), source="test", origin="memory")).ok
    assert board.sets["demo-vllm"] is not rs and board.sets["demo-vllm"].readings == {}  # new endpoints: afresh
