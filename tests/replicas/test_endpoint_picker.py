"""Endpoint-picker mode, sans I/O: the decisions (body, subset hint, shedding), one ext_proc stream
driven with real ProcessingRequests over a board with hand-made readings, pool membership, and
the config loader."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from google.protobuf import json_format

from contracts.config import parse_config
from contracts.config.endpoint_picker import EndpointPickerConfig, load_endpoint_picker, parse_endpoints
from contracts.errors import ClientError, ConfigError, Unavailable
from extproc.epp import decision
from extproc.epp.members import PoolMembers
from extproc.epp.stream import EppStream
from extproc.replicas.board import ReplicaBoard
from extproc.replicas.readings import ReplicaReading
from tests.stack_config import ROOT

A, B, C = "10.0.0.1:8000", "10.0.0.2:8000", "10.0.0.3:8000"
NOW = 100.0
CFG = EndpointPickerConfig(pool="pool", endpoints=[A, B, C], replica_metrics={"kind": "vllm", "interval_ms": 50},
                           shed_queue=10, objectives={"batch": -1, "chat": 1}, fallbacks=1)
CHAT = json.dumps({"model": "m", "messages": [{"role": "system", "content": "You help. " * 60},
                                               {"role": "user", "content": "hi"}]}).encode()


def _board(readings: dict[str, ReplicaReading], cfg: EndpointPickerConfig = CFG) -> ReplicaBoard:
    board = ReplicaBoard([], clock=lambda: NOW)
    board.reconfigure_sets({cfg.pool: (list(cfg.endpoints), cfg.replica_metrics)})
    board.sets[cfg.pool].readings.update(readings)
    return board


def _r(waiting: float = 0, kv: float | None = None, at: float = NOW) -> ReplicaReading:
    return ReplicaReading(waiting, 0, kv, at)


def _headers(end: bool = False, subset: object = None, **extra: str) -> pb.ProcessingRequest:
    req = pb.ProcessingRequest()
    hs = req.request_headers.headers.headers
    for k, v in {":method": "POST", ":path": "/v1/chat/completions", **extra}.items():
        hs.add(key=k, raw_value=v.encode())
    req.request_headers.end_of_stream = end
    if subset is not None:
        json_format.ParseDict({decision.SUBSET_KEY: subset},
                              req.metadata_context.filter_metadata[decision.SUBSET_NAMESPACE])
    return req


def _body(data: bytes, end: bool = True) -> pb.ProcessingRequest:
    req = pb.ProcessingRequest()
    req.request_body.body = data
    req.request_body.end_of_stream = end
    return req


def _destination(resp: pb.ProcessingResponse) -> tuple[str, str]:
    """(the header the reply sets, the `envoy.lb` metadata value): the protocol wants them equal."""
    headers = {h.header.key: h.header.raw_value.decode()
               for h in resp.request_headers.response.header_mutation.set_headers}
    meta = json_format.MessageToDict(resp.dynamic_metadata)[decision.DESTINATION_NAMESPACE][decision.DESTINATION_KEY]
    assert resp.request_headers.response.clear_route_cache
    return headers[decision.DESTINATION_KEY], meta


# -- decisions ---------------------------------------------------------------------------------
def test_the_body_gives_model_and_prompt_and_bad_json_is_a_400() -> None:
    ask = decision.read_body(CHAT)
    assert ask.model == "m" and ask.prompt is not None and ask.prompt.startswith("You help.")
    assert decision.read_body(b'{"model": "m", "prompt": "once upon"}') == decision.InferenceAsk("m", "once upon")
    assert decision.read_body(b'{"model": "m", "messages": "not a list"}') == decision.InferenceAsk("m", None)
    assert decision.read_body(b"") == decision.InferenceAsk(None, None)
    for bad in (b"{not json", b"[1, 2]", b"\xff\xfe"):
        with pytest.raises(ClientError) as e:
            decision.read_body(bad)
        assert e.value.status == 400


def test_the_subset_hint_as_a_list_or_a_comma_string() -> None:
    ns = decision.SUBSET_NAMESPACE
    assert decision.subset_hint({}) is None
    assert decision.subset_hint({ns: {}}) is None
    assert decision.subset_hint({ns: {decision.SUBSET_KEY: [A, f"{B}, {C}"]}}) == [A, B, C]
    assert decision.subset_hint({ns: {decision.SUBSET_KEY: f" {A},{B} "}}) == [A, B]
    assert decision.subset_hint({ns: {decision.SUBSET_KEY: []}}) == []
    assert decision.candidates([A, B, C], None) == [A, B, C]
    assert decision.candidates([A, B, C], [C, "10.9.9.9:1"]) == [C]
    assert decision.candidates([A, B, C], ["10.0.0.2"]) == [B]  # an IP alone allows its every port
    assert decision.candidates([A, B, C], []) == []


def test_priority_comes_from_the_named_objective() -> None:
    assert decision.priority(CFG, {}) == 0
    assert decision.priority(CFG, {decision.OBJECTIVE_HEADER: "batch"}) == -1
    assert decision.priority(CFG, {decision.OBJECTIVE_HEADER: "unknown"}) == 0


# -- one stream --------------------------------------------------------------------------------
def test_the_headers_reply_waits_for_the_body_then_names_the_short_queue() -> None:
    board = _board({A: _r(waiting=9), B: _r(waiting=1), C: _r(waiting=4)})
    s = EppStream(CFG, board)
    assert s.handle(_headers()) == []
    assert s.handle(_body(CHAT[:10], end=False)) == []
    head, body = s.handle(_body(CHAT[10:]))
    assert _destination(head) == (f"{B},{C}", f"{B},{C}")  # the pick, then one fallback
    set_headers = {h.header.key: h.header.raw_value for h in head.request_headers.response.header_mutation.set_headers}
    assert set_headers["content-length"] == str(len(CHAT)).encode()
    assert body.request_body.response.body_mutation.streamed_response.body == CHAT
    assert body.request_body.response.body_mutation.streamed_response.end_of_stream
    assert board.sets["pool"].in_flight == {B: 1}
    # The answer: status, then the body passed through chunk by chunk; the call is done at its end.
    resp = pb.ProcessingRequest()
    resp.response_headers.headers.headers.add(key=":status", raw_value=b"200")
    assert s.handle(resp)[0].HasField("response_headers")
    chunk = pb.ProcessingRequest()
    chunk.response_body.body = b"data: {}\n\n"
    chunk.response_body.end_of_stream = True
    [out] = s.handle(chunk)
    assert out.response_body.response.body_mutation.streamed_response.body == b"data: {}\n\n"
    assert board.sets["pool"].in_flight == {} and board.sets["pool"].failed_at == {}


def test_a_5xx_answer_holds_the_replica_back_and_the_served_endpoint_is_credited() -> None:
    board = _board({A: _r(), B: _r(waiting=1), C: _r(waiting=2)})
    s = EppStream(CFG, board)
    s.handle(_headers(end=True))  # no body: picked at the headers
    resp = pb.ProcessingRequest()
    resp.response_headers.headers.headers.add(key=":status", raw_value=b"503")
    resp.response_headers.end_of_stream = True
    # The proxy retried down the list: B answered, and B is the one that failed.
    json_format.ParseDict({decision.SERVED_KEY: B}, resp.metadata_context.filter_metadata["envoy.lb"])
    s.handle(resp)
    assert board.sets["pool"].failed_at == {A: NOW, B: NOW}  # the proxy went past A; B answered 503
    assert board.sets["pool"].in_flight == {}
    s.close()


def test_the_subset_hint_bounds_the_pick_and_an_empty_one_is_503() -> None:
    board = _board({A: _r(), B: _r(waiting=5), C: _r(waiting=9)})
    [head] = EppStream(CFG, board).handle(_headers(end=True, subset=f"{C}"))
    assert _destination(head)[0] == C
    [head] = EppStream(CFG, board).handle(_headers(end=True, subset=[B, C]))
    assert _destination(head)[0] == f"{B},{C}"
    [refusal] = EppStream(CFG, board).handle(_headers(end=True, subset=["10.9.9.9:1"]))
    assert refusal.immediate_response.status.code == 503
    assert b"no ready endpoint in InferencePool pool" in refusal.immediate_response.body


def test_no_fresh_reading_is_503_with_retry_after() -> None:
    board = _board({A: _r(at=NOW - 5)})  # stale; B and C never answered
    s = EppStream(CFG, board)
    s.handle(_headers())
    [refusal] = s.handle(_body(CHAT))
    ir = refusal.immediate_response
    assert ir.status.code == 503 and json.loads(ir.body)["error"]["type"]
    assert ("retry-after", b"1") in [(h.header.key, h.header.raw_value) for h in ir.headers.set_headers]
    assert s.handle(_body(b"more")) == []  # answered: the rest of the stream is not ours


def test_saturation_sheds_only_sheddable_requests() -> None:
    board = _board({A: _r(waiting=11), B: _r(waiting=12), C: _r(waiting=20)})
    [refusal] = EppStream(CFG, board).handle(_headers(end=True, **{decision.OBJECTIVE_HEADER: "batch"}))
    assert refusal.immediate_response.status.code == 429
    for headers in ({}, {decision.OBJECTIVE_HEADER: "chat"}):
        [head] = EppStream(CFG, board).handle(_headers(end=True, **headers))
        assert _destination(head)[0].startswith(A)
    # One candidate under the bound: the sheddable request goes there.
    board.sets["pool"].readings[C] = _r(waiting=3)
    [head] = EppStream(CFG, board).handle(_headers(end=True, **{decision.OBJECTIVE_HEADER: "batch"}))
    assert _destination(head)[0].startswith(C)
    # KV cache over its bound saturates too.
    kv = CFG.model_copy(update={"shed_queue": None, "shed_kv": 0.9})
    full = _board({A: _r(kv=0.95), B: _r(kv=0.99), C: _r(kv=0.91)}, kv)
    with pytest.raises(Unavailable):
        decision.decide(kv, full.pick("pool")[0], full.sets["pool"].readings, -1, "pool")


def test_prefix_affinity_follows_what_was_sent_where() -> None:
    board = _board({A: _r(waiting=1), B: _r(waiting=0), C: _r(waiting=3)})
    s = EppStream(CFG, board)
    s.handle(_headers())
    assert _destination(s.handle(_body(CHAT))[0])[0].startswith(B)
    board.sets["pool"].readings[B] = _r(waiting=2)
    board.sets["pool"].readings[A] = _r(waiting=0)
    s = EppStream(CFG, board)
    s.handle(_headers())
    assert _destination(s.handle(_body(CHAT))[0])[0].startswith(B)  # the prefix is there


def test_an_oversized_body_is_413() -> None:
    cfg = CFG.model_copy(update={"max_body_bytes": 1024})
    s = EppStream(cfg, _board({A: _r()}, cfg))
    s.handle(_headers())
    assert s.handle(_body(b"x" * 600, end=False)) == []
    [refusal] = s.handle(_body(b"x" * 600, end=False))
    assert refusal.immediate_response.status.code == 413


# -- membership and config -----------------------------------------------------------------------
def test_membership_from_list_environment_and_file_keeps_the_last_good_file(tmp_path: Path) -> None:
    seen: list[list[str]] = []
    cfg = EndpointPickerConfig(pool="p", endpoints=[A], endpoints_file=str(tmp_path / "eps"))
    m = PoolMembers(cfg, seen.append, environ={"MODELYARD_EPP_ENDPOINTS": f"{B},{A}"})
    assert m.current == [A, B]
    assert m.read_file() is None  # not there yet
    m.load_file(f"# pods\n{C}\n{A}\n")
    assert seen == [[A, B, C]]
    m.load_file(f"# pods\n{C}\n{A}\n")  # unchanged: nothing to do
    m.load_file("not-an-endpoint\n")  # bad: the last good membership stays
    assert m.current == [A, B, C] and len(seen) == 1
    m.load_file("")
    assert seen[-1] == [A, B]


def test_a_membership_change_keeps_the_remaining_replicas_state() -> None:
    board = _board({A: _r(), B: _r(waiting=1)})
    rs = board.sets["pool"]
    board.sent("pool", A, [b"h"])
    board.reconfigure_sets({"pool": ([A, C], CFG.replica_metrics)}, keep_members=True)
    assert board.sets["pool"] is rs and rs.endpoints == [A, C]
    assert rs.in_flight == {A: 1} and set(rs.readings) == {A} and len(rs.prefix) == 1
    board.reconfigure_sets({"pool": ([], CFG.replica_metrics)}, keep_members=True)
    assert board.pick("pool")[0].endpoint is None


def test_parse_endpoints_and_the_loader(tmp_path: Path) -> None:
    assert parse_endpoints(f"{A}, {B}\n{A} # again") == [A, B]
    assert parse_endpoints(json.dumps([C])) == [C]
    for bad in ("pod-a:8000", "10.0.0.1", '["10.0.0.1:1", 3]'):
        with pytest.raises(ValueError):
            parse_endpoints(bad)
    alone = tmp_path / "epp.yaml"
    alone.write_text("pool: alone\nendpoints: ['10.0.0.1:8000']\n")
    assert load_endpoint_picker(alone).pool == "alone"
    assert load_endpoint_picker(alone, pool="other", address="0.0.0.0:9002").address == "0.0.0.0:9002"
    shipped = load_endpoint_picker(ROOT / "modelyard.yaml")
    cfg = parse_config(__import__("yaml").safe_load((ROOT / "modelyard.yaml").read_text()))
    assert cfg.endpoint_picker == shipped
    with pytest.raises(ConfigError, match="endpoint_picker.endpoints"):
        load_endpoint_picker(None, pool="p", endpoints=["pod-a:80"])
    (tmp_path / "none.yaml").write_text("listener: {}\n")
    with pytest.raises(ConfigError, match="no endpoint_picker section"):
        load_endpoint_picker(tmp_path / "none.yaml")


def test_a_body_ended_by_trailers_is_picked_at_the_trailers() -> None:
    board = _board({A: _r(), B: _r(waiting=3), C: _r(waiting=3)})
    s = EppStream(CFG, board)
    s.handle(_headers())
    assert s.handle(_body(CHAT, end=False)) == []
    trailers = pb.ProcessingRequest()
    trailers.request_trailers.trailers.headers.add(key="x-checksum", raw_value=b"1")
    head, body, tail = s.handle(trailers)
    assert _destination(head)[0].startswith(A)
    sr = body.request_body.response.body_mutation.streamed_response
    assert sr.body == CHAT and not sr.end_of_stream  # the trailers end it
    assert tail.HasField("request_trailers")
