"""bench_gateway's count of the ext_proc replies a request waits on in turn, per processing mode."""

from __future__ import annotations

from bench.bench_gateway import sequential_waits


def _mode(rqh: str = "SEND", rqb: str = "BUFFERED", rsh: str = "SEND", rsb: str = "BUFFERED") -> dict[str, str]:
    return {"request_header_mode": rqh, "request_body_mode": rqb, "response_header_mode": rsh,
            "response_body_mode": rsb}


def test_buffered_design_waits_on_every_message() -> None:
    assert sequential_waits(_mode()) == 4
    assert sequential_waits(_mode(rsb="STREAMED")) == 4  # an SSE answer, switched to STREAMED: one wait


def test_skipped_response_headers_is_the_three_message_floor() -> None:
    assert sequential_waits(_mode(rsh="SKIP")) == 3


def test_full_duplex_holds_headers_for_the_body_one_wait_per_side() -> None:
    assert sequential_waits(_mode(rqb="FULL_DUPLEX_STREAMED", rsb="FULL_DUPLEX_STREAMED")) == 2


def test_no_body_sent_is_no_wait() -> None:
    assert sequential_waits(_mode(rqb="NONE", rsb="NONE")) == 2
