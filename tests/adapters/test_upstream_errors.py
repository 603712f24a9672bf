"""Upstream error bodies: the caller sees a status and a short provider message, never a traceback."""

from __future__ import annotations

import orjson
from hypothesis import given, settings
from hypothesis import strategies as st

from adapters.upstream_errors import MAX_MESSAGE_CHARS, client_text, log_excerpt, provider_message, sanitize
from tests.adapters.upstream_bodies import TRACEBACK


def test_traceback_body_becomes_the_status_alone() -> None:
    assert client_text(500, TRACEBACK) == "upstream error (HTTP 500)"
    assert client_text(500, orjson.dumps({"error": {"message": TRACEBACK.decode()}})) == "upstream error (HTTP 500)"


def test_provider_error_object_keeps_its_first_line() -> None:
    body = orjson.dumps({"error": {"message": "model overloaded\nretry later", "type": "server_error"}})
    assert client_text(503, body) == "upstream error (HTTP 503): model overloaded"
    assert client_text(503, body, "t-1") == "upstream error (HTTP 503): model overloaded (task t-1)"


def test_paths_masked_urls_kept() -> None:
    assert sanitize("cannot open /mnt/weights/llama/shard-3.bin") == "cannot open <path>"
    assert sanitize(r"cannot open C:\models\x.bin now") == "cannot open <path> now"
    assert sanitize("see https://docs.example.com/en/errors") == "see https://docs.example.com/en/errors"


def test_log_excerpt_is_one_truncated_line() -> None:
    text = log_excerpt(TRACEBACK * 100)
    assert "\n" not in text and text.endswith("(truncated)") and len(text) < 2500


@settings(max_examples=300, deadline=None)
@given(st.one_of(st.text(max_size=600), st.binary(max_size=600)), st.sampled_from(["error.message", "error", "message"]))
def test_caller_text_is_short_single_line_and_frame_free(raw, where: str) -> None:
    msg = raw if isinstance(raw, str) else raw.decode("utf-8", "replace")
    obj = {"error": {"message": msg}} if where == "error.message" else {where: msg}
    for body in (orjson.dumps(obj), raw if isinstance(raw, bytes) else raw.encode()):
        got = provider_message(body)
        if got is not None:
            assert len(got) <= MAX_MESSAGE_CHARS and "\n" not in got and "\r" not in got
            assert 'File "' not in got and "Traceback" not in got
        out = client_text(500, body)
        assert out.startswith("upstream error (HTTP 500)") and len(out) <= MAX_MESSAGE_CHARS + 40
