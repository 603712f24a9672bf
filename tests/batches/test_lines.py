"""A batch's input, pure: every line either a request to run or refused with its reason."""

from __future__ import annotations

import orjson
import pytest

from contracts.errors import ClientError
from extproc.batches.lines import parse_anthropic_requests, parse_openai_input


def _line(cid: object, **over: object) -> bytes:
    doc = {"custom_id": cid, "method": "POST", "url": "/v1/chat/completions",
           "body": {"model": "m", "messages": [{"role": "user", "content": "hi"}]}, **over}
    return orjson.dumps(doc)


def test_valid_lines_become_tasks_and_bad_ones_are_refused_with_a_reason() -> None:
    data = b"\n".join([_line("a"), b"{nope", b"   ", _line("a"), _line("b", url="/v1/embeddings"),
                       _line("c", method="GET"), _line(""), b"[1]", _line("d", body={"stream": True}),
                       _line("e", body="text"), _line("f")]) + b"\n"
    got = parse_openai_input(data, "batch_x", "/v1/chat/completions", 100)
    refs = [(r.ref.index, r.ref.custom_id, r.ref.task_id, r.ref.error_code) for r in got]
    assert refs == [(1, "a", "batch_x-1", None), (2, None, None, "invalid_json_line"),
                    (4, "a", None, "duplicate_custom_id"), (5, "b", None, "invalid_url"),
                    (6, "c", None, "invalid_method"), (7, None, None, "missing_required_parameter"),
                    (8, None, None, "invalid_request"), (9, "d", None, "invalid_request"),
                    (10, "e", None, "invalid_request"), (11, "f", "batch_x-11", None)]
    assert orjson.loads(got[0].body) == {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    assert got[1].body == b""


@pytest.mark.parametrize(("data", "endpoint", "most", "says"), [
    (b"", "/v1/chat/completions", 10, "no requests"),
    (b"\n \n", "/v1/chat/completions", 10, "no requests"),
    (_line("a"), "/v1/completions", 10, "endpoint must be one of"),
    (_line("a") + b"\n" + _line("b"), "/v1/chat/completions", 1, "more than 1 requests"),
])
def test_a_file_that_is_no_batch_is_a_400(data: bytes, endpoint: str, most: int, says: str) -> None:
    with pytest.raises(ClientError) as e:
        parse_openai_input(data, "batch_x", endpoint, most)
    assert e.value.status == 400 and says in e.value.message


def test_anthropic_requests_run_in_order_and_a_malformed_array_is_refused_whole() -> None:
    got = parse_anthropic_requests({"requests": [{"custom_id": "one", "params": {"model": "m"}},
                                                 {"custom_id": "two", "params": {"model": "n"}}]}, "msgbatch_x", 10)
    assert [(r.ref.index, r.ref.custom_id, r.ref.task_id) for r in got] == [(0, "one", "msgbatch_x-0"),
                                                                              (1, "two", "msgbatch_x-1")]
    for doc in ({}, {"requests": []}, {"requests": [{"custom_id": "a b", "params": {}}]},
                {"requests": [{"custom_id": "a", "params": {}}, {"custom_id": "a", "params": {}}]},
                {"requests": [{"custom_id": "a", "params": {"stream": True}}]},
                {"requests": [{"custom_id": "a"}]}, {"requests": ["x"]}, []):
        with pytest.raises(ClientError):
            parse_anthropic_requests(doc, "msgbatch_x", 10)
    with pytest.raises(ClientError):
        parse_anthropic_requests({"requests": [{"custom_id": str(i), "params": {}} for i in range(3)]}, "b", 2)
