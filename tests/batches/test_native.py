"""Native batches, pure (extproc/batches/native.py): each line rendered for the provider (translated
where the caller's protocol differs), the provider's input, and its results read back by line in the
caller's protocol, in the shapes OpenAI's Batch API and Anthropic's Message Batches document."""

from __future__ import annotations

import orjson
import pytest

from contracts.errors import ClientError
from extproc.batches import native
from extproc.batches.native import NativeTarget

OPENAI = NativeTarget("gw-gpt", "c-openai", "openai", "gpt-4o-mini")
ANTHROPIC = NativeTarget("gw-claude", "c-anthropic", "anthropic", "claude-3-5-haiku")
CHAT = orjson.dumps({"model": "gw-gpt", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 16})
MESSAGES = orjson.dumps({"model": "gw-claude", "max_tokens": 16, "messages": [{"role": "user", "content": "hi"}]})


def test_same_protocol_lines_keep_their_body_with_the_upstream_model() -> None:
    assert native.render_line("openai", OPENAI, CHAT) == {**orjson.loads(CHAT), "model": "gpt-4o-mini"}
    assert native.render_line("anthropic", ANTHROPIC, MESSAGES)["model"] == "claude-3-5-haiku"


def test_lines_are_translated_for_the_other_provider() -> None:
    params = native.render_line("openai", ANTHROPIC, CHAT)
    assert params["model"] == "claude-3-5-haiku" and params["max_tokens"] == 16
    assert params["messages"] == [{"role": "user", "content": [{"type": "text", "text": "hi"}]}] or \
        params["messages"] == [{"role": "user", "content": "hi"}]
    body = native.render_line("anthropic", OPENAI, MESSAGES)
    assert body["model"] == "gpt-4o-mini" and body["messages"][-1]["role"] == "user"
    with pytest.raises(ClientError):  # what the other protocol cannot take is refused (the line's error)
        native.render_line("openai", ANTHROPIC, orjson.dumps({"model": "m", "messages": "nope"}))


def test_inputs_use_the_gateways_own_custom_ids() -> None:
    lines = [(1, {"model": "x"}), (3, {"model": "y"})]
    rows = [orjson.loads(x) for x in native.openai_input(lines).splitlines()]
    assert [(r["custom_id"], r["url"], r["method"]) for r in rows] == [("line-1", "/v1/chat/completions", "POST"),
                                                                      ("line-3", "/v1/chat/completions", "POST")]
    assert native.anthropic_input(lines) == {"requests": [{"custom_id": "line-1", "params": {"model": "x"}},
                                                          {"custom_id": "line-3", "params": {"model": "y"}}]}


def _completion(text: str) -> dict:
    return {"id": "chatcmpl-1", "object": "chat.completion", "created": 1, "model": "gpt-4o-mini",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 7, "completion_tokens": 3, "total_tokens": 10}}


def test_openai_output_and_error_files_by_line() -> None:
    out = orjson.dumps({"id": "r1", "custom_id": "line-1", "error": None,
                        "response": {"status_code": 200, "request_id": "q", "body": _completion("yes")}})
    err = b"\n".join([
        orjson.dumps({"id": "r2", "custom_id": "line-2", "error": None, "response": {
            "status_code": 400, "request_id": "q2", "body": {"error": {"message": "bad", "type": "invalid_request_error"}}}}),
        orjson.dumps({"id": "r3", "custom_id": "line-3", "response": None,
                      "error": {"code": "batch_cancelled", "message": "cancelled"}}),
        b"not json"])
    got = native.openai_results("openai", OPENAI, out, err)
    assert got[1].kind == "succeeded" and got[1].usage is not None and got[1].usage.input_tokens == 7
    assert orjson.loads(got[1].body or b"")["model"] == "gw-gpt"  # the gateway's name
    assert (got[2].kind, got[2].status) == ("failed", 400)
    assert got[3].kind == "cancelled" and 4 not in got
    # the same answers for an Anthropic caller: translated, errors in Anthropic's shape
    back = native.openai_results("anthropic", OPENAI, out, err)
    msg = orjson.loads(back[1].body or b"")
    assert msg["type"] == "message" and msg["model"] == "gw-gpt" and msg["content"][0]["text"] == "yes"
    assert orjson.loads(back[2].body or b"")["type"] == "error"


def test_anthropic_results_by_line() -> None:
    message = {"id": "msg_1", "type": "message", "role": "assistant", "model": "claude-3-5-haiku",
               "content": [{"type": "text", "text": "hello"}], "stop_reason": "end_turn", "stop_sequence": None,
               "usage": {"input_tokens": 5, "output_tokens": 2}}
    results = b"\n".join(orjson.dumps(r) for r in [
        {"custom_id": "line-0", "result": {"type": "succeeded", "message": message}},
        {"custom_id": "line-1", "result": {"type": "errored", "error": {
            "type": "error", "error": {"type": "invalid_request_error", "message": "max_tokens: too big"}}}},
        {"custom_id": "line-2", "result": {"type": "expired"}},
        {"custom_id": "someone-else", "result": {"type": "succeeded", "message": message}}])
    got = native.anthropic_results("anthropic", ANTHROPIC, results)
    assert set(got) == {0, 1, 2}
    assert got[0].kind == "succeeded" and orjson.loads(got[0].body or b"")["model"] == "gw-claude"
    assert (got[1].kind, got[1].status) == ("failed", 400) and got[2].kind == "cancelled"
    as_openai = native.anthropic_results("openai", ANTHROPIC, results)
    completion = orjson.loads(as_openai[0].body or b"")
    assert completion["object"] == "chat.completion" and completion["choices"][0]["message"]["content"] == "hello"
    assert completion["usage"]["prompt_tokens"] == 5
    assert orjson.loads(as_openai[1].body or b"")["error"]["message"] == "max_tokens: too big"


def test_ended_reads_each_providers_status() -> None:
    assert native.ended("openai", {"status": "completed"}) and not native.ended("openai", {"status": "finalizing"})
    assert native.ended("anthropic", {"processing_status": "ended"})
    assert not native.ended("anthropic", {"processing_status": "canceling"}) and not native.ended("openai", [])
