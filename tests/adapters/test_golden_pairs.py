"""Every client/upstream pair against its golden folder (tests/adapters/golden/<client>-to-<upstream>/,
see golden_pairs.py): the exact upstream request a client request becomes, the exact client
response and stream events an upstream answer becomes, each also checked for meaning by readers
independent of the adapter under test (the real SDKs, the canonical request)."""

from __future__ import annotations

import orjson
import pytest

from adapters.registry import PROTOCOLS
from tests.adapters.fixtures import canonical_for
from tests.adapters.golden_pairs import (
    CLIENT_MODEL,
    UPSTREAM_MODEL,
    Case,
    cases,
    pair_dirs,
    plain,
    render_request,
    render_response,
    scrub,
    translate,
)
from tests.adapters.translation_checks import (
    NAMES,
    UPSTREAMS,
    canon,
    client_events,
    decode,
    meaning,
    parse,
    sdk_check,
    summary,
)

REQUESTS, RESPONSES, STREAMS = cases("request"), cases("response-"), cases("stream-")
# A response and a stream of the same kind in one folder (text, tool): they must mean the same.
TWINS = [(r, s) for r in RESPONSES for s in STREAMS
         if s.path.parent == r.path.parent and s.kind.removeprefix("stream-") == r.kind.removeprefix("response-")]


def test_every_pair_has_a_folder_with_every_kind_of_case() -> None:
    assert {d.name for d in pair_dirs()} >= {f"{c}-to-{u}" for c in NAMES for u in UPSTREAMS}
    for d in pair_dirs():
        kinds = {p.stem for p in d.glob("*.json")}
        assert "request" in kinds and any(k.startswith("response-") for k in kinds) \
            and any(k.startswith("stream-") for k in kinds), d


@pytest.mark.parametrize("case", REQUESTS, ids=[c.id for c in REQUESTS])
def test_request_becomes_the_golden_upstream_request(case: Case) -> None:
    golden = case.load()
    assert render_request(case.client, case.upstream, golden["client"]) == golden["upstream"]
    # The client's request means the canonical conversation, and so does what the upstream gets.
    expected = canonical_for(case.upstream)
    assert canon(parse(case.client, orjson.dumps(golden["client"]))) == expected
    sent = orjson.dumps(golden["upstream"]["body"])
    again = parse(case.upstream, sent) if case.upstream != "gemini" else \
        PROTOCOLS["gemini"].parse_request(sent, path_model=UPSTREAM_MODEL)
    assert canon(again) == expected


@pytest.mark.parametrize("case", RESPONSES, ids=[c.id for c in RESPONSES])
def test_response_becomes_the_golden_client_response(case: Case) -> None:
    golden = case.load()
    raw = render_response(case.client, case.upstream, golden["upstream"])
    sdk_check(case.client, raw)
    assert scrub(orjson.loads(raw)) == golden["client"]
    assert plain(meaning(PROTOCOLS[case.upstream].parse_response(orjson.dumps(golden["upstream"])))) == golden["meaning"]
    back = PROTOCOLS[case.client].parse_response(raw)
    assert plain(meaning(back)) == golden["meaning"]
    assert back.model == CLIENT_MODEL


@pytest.mark.parametrize("case", STREAMS, ids=[c.id for c in STREAMS])
def test_stream_becomes_the_golden_client_events(case: Case) -> None:
    golden = case.load()
    upstream = golden["upstream"].encode()
    # Fed in awkward 5-byte pieces to exercise reassembly across the whole pipeline.
    tr, out = translate(case.client, case.upstream, upstream)
    assert tr.finished and tr.error is None
    text, calls, finish, input_tokens, output_tokens, ended = golden["meaning"]
    assert (tr.meter.reported.input_tokens, tr.meter.reported.output_tokens) == (input_tokens, output_tokens)
    assert scrub(client_events(case.client, out)) == golden["client"]
    assert plain(summary(decode(case.upstream, [upstream]))) == golden["meaning"]
    # Decoding our own client output recovers the same meaning.
    assert plain(summary(decode(case.client, [out]))) == golden["meaning"]


@pytest.mark.parametrize(("response", "stream"), TWINS, ids=[r.id.removesuffix(r.kind) + r.kind.removeprefix("response-")
                                                              for r, _ in TWINS])
def test_a_stream_and_a_response_of_one_kind_mean_the_same(response: Case, stream: Case) -> None:
    assert response.load()["meaning"][:3] == stream.load()["meaning"][:3]
