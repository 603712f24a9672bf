"""The replay asks for the identity answer and undoes any coding that still comes back (pure)."""

from __future__ import annotations

import gzip
import zlib

import pytest

from extproc.tasks import identity, state
from extproc.tasks.identity import UndecodableAnswer, identity_body, replay_headers

BODY = b'{"choices":[{"message":{"content":"readable"}}]}'


def test_the_replay_asks_for_identity_whatever_the_task_stored() -> None:
    # A task stored before accept-encoding was dropped still carries the submitter's preference.
    stored = (("content-type", "application/json"), ("Accept-Encoding", "gzip, deflate, br"))
    assert replay_headers(stored) == [("content-type", "application/json"), ("accept-encoding", "identity")]
    assert replay_headers(()) == [("accept-encoding", "identity")]


def test_the_stored_request_drops_the_submitters_accept_encoding() -> None:
    req = state.stored_request("POST", "/v1/chat/completions", "", {"accept-encoding": "gzip, deflate",
                                                                     "content-type": "application/json"}, b"{}")
    assert dict(req.headers) == {"content-type": "application/json"}


@pytest.mark.parametrize("coding,pack", [
    ("gzip", gzip.compress), ("x-gzip", gzip.compress), ("GZIP", gzip.compress),
    ("deflate", zlib.compress),  # RFC 9110's deflate: zlib-wrapped
    ("deflate", lambda b: zlib.compress(b, wbits=-zlib.MAX_WBITS)),  # the raw deflate some servers send
    ("gzip, identity", gzip.compress),
    ("deflate, gzip", lambda b: gzip.compress(zlib.compress(b))),  # undone last applied first
    ("gzip", lambda b: gzip.compress(b[:9]) + gzip.compress(b[9:])),  # two gzip members
], ids=["gzip", "x-gzip", "case", "deflate", "raw-deflate", "with-identity", "stacked", "members"])
def test_coded_answers_are_decoded(coding: str, pack) -> None:
    assert identity_body(pack(BODY), coding) == BODY


@pytest.mark.parametrize("coding", [None, "", "identity"])
def test_identity_answers_are_kept_byte_for_byte(coding: str | None) -> None:
    binary = b"\x1f\x8b\x00\xff tensor bytes that merely look like gzip"
    assert identity_body(binary, coding) == binary


@pytest.mark.parametrize("coding,body,says", [
    ("br", b"\x0b\x02\x80hi\x03", "'br'"),
    ("zstd", b"\x28\xb5\x2f\xfd", "'zstd'"),
    ("gzip", gzip.compress(BODY)[:-12], "truncated"),
    ("gzip", b"not gzip at all", "broken"),
], ids=["br", "zstd", "truncated", "garbage"])
def test_what_cannot_be_decoded_says_why(coding: str, body: bytes, says: str) -> None:
    with pytest.raises(UndecodableAnswer, match=says):
        identity_body(body, coding)


def test_an_answer_inflating_past_the_cap_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(identity, "_MAX_RESULT_BYTES", 1024)
    assert identity_body(gzip.compress(b"x" * 1024), "gzip") == b"x" * 1024
    with pytest.raises(UndecodableAnswer, match="past 1024 bytes"):
        identity_body(gzip.compress(b"x" * 4096), "gzip")
