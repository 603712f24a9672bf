"""Demo OpenAI Responses API upstream (POST /v1/responses): the stand-in for OpenAI's newer models,
which are served through the Responses API only.

    python -m devstack.demo.responses_server --port 8110 [--name demo-responses] [--require-key-env VAR]

Answers as described in `devstack.demo.behaviour` (a `message` item, a `function_call` item when
tools are given and the text asks for the weather, usage), whole or as typed SSE events. Output a
chat protocol cannot express comes on request, so tests can check the gateway refuses to drop it:
a text holding one of `EXTRA_ITEMS`' markers gets that output item first (a hosted tool's call, a
custom tool call, a reasoning item with or without a summary). The summary streams as OpenAI's
reasoning models send it when asked for `reasoning.summary` and `reasoning.encrypted_content`: a
summary part, its text deltas, `.done` events, and the item's `encrypted_content` at its end.
"""

from __future__ import annotations

import hmac
from typing import Any

import orjson
from aiohttp import web

from adapters import responses
from adapters.sse import SSEFramer, encode_event
from contracts.errors import ModelyardError
from devstack.demo.adapter_server import AdapterDemo, DemoSite, parse, serve
from devstack.demo.behaviour import demo_reply, demo_stream_events, last_user_text

WEB_SEARCH = "demo-web-search"  # a web_search_call item: a hosted tool's call
CUSTOM_TOOL = "demo-custom-tool"  # a custom_tool_call item (free-form input, no JSON arguments)
REASONING = "demo-reasoning-hidden"  # a reasoning item with no visible text: carried as hidden reasoning
REASONING_SUMMARY = "demo-reasoning-summary"  # a reasoning item with a summary

# marker -> the output item the answer starts with (as OpenAI shapes it)
EXTRA_ITEMS: dict[str, dict[str, Any]] = {
    WEB_SEARCH: {"type": "web_search_call", "id": "ws_demo", "status": "completed",
                 "action": {"type": "search", "query": "demo query"}},
    CUSTOM_TOOL: {"type": "custom_tool_call", "id": "ctc_demo", "call_id": "call_custom", "name": "grammar",
                  "input": "SELECT 1", "status": "completed"},
    REASONING_SUMMARY: {"type": "reasoning", "id": "rs_demo", "summary": [
        {"type": "summary_text", "text": "The user wants an echo."}], "encrypted_content": "gAAAAA-demo-state"},
    REASONING: {"type": "reasoning", "id": "rs_demo", "summary": []},
}


def extra_item(text: str) -> dict[str, Any] | None:
    return next((item for marker, item in EXTRA_ITEMS.items() if marker in text), None)


def _with_item_first(body: bytes, item: dict[str, Any]) -> bytes:
    obj = orjson.loads(body)
    obj["output"] = [item, *obj["output"]]
    return orjson.dumps(obj)


def _summary_events(item: dict[str, Any]) -> list[dict[str, Any]]:
    """A reasoning item's summary parts as OpenAI streams them: part added, text deltas, done events."""
    out: list[dict[str, Any]] = []
    for j, part in enumerate(item.get("summary", ()) if item["type"] == "reasoning" else ()):
        where = {"item_id": item["id"], "output_index": 0, "summary_index": j}
        text = part["text"]
        out.append({"type": "response.reasoning_summary_part.added", **where, "part": {**part, "text": ""}})
        for piece in (text[:len(text) // 2], text[len(text) // 2:]):
            out.append({"type": "response.reasoning_summary_text.delta", **where, "delta": piece})
        out.append({"type": "response.reasoning_summary_text.done", **where, "text": text})
        out.append({"type": "response.reasoning_summary_part.done", **where, "part": part})
    return out


def _stream_with_item_first(raw: bytes, item: dict[str, Any]) -> bytes:
    """The encoder's events with `item` added as output 0 right after `response.in_progress`:
    later output indices move up one, the final snapshot lists it, sequence numbers are redone."""
    f = SSEFramer()
    events = [orjson.loads(ev.data) for ev in f.feed(raw) + f.close()]
    out: list[dict[str, Any]] = []
    for ev in events:
        if "output_index" in ev:
            ev["output_index"] += 1
        resp = ev.get("response")
        if isinstance(resp, dict) and resp.get("status") != "in_progress":
            resp["output"] = [item, *resp["output"]]
        out.append(ev)
        if ev["type"] == "response.in_progress":
            out.append({"type": "response.output_item.added", "output_index": 0,
                        "item": {"type": "reasoning", "id": item["id"], "summary": []} if item["type"] == "reasoning"
                        else item})
            out += _summary_events(item)
            out.append({"type": "response.output_item.done", "output_index": 0, "item": item})
    return b"".join(encode_event(orjson.dumps({**ev, "sequence_number": n}), ev["type"]) for n, ev in enumerate(out))


class ResponsesDemo(AdapterDemo):
    async def handle(self, request: web.Request, path_model: str | None = None,
                     stream_hint: bool = False) -> web.StreamResponse:
        try:
            req = responses.parse_request(await request.read())
        except ModelyardError:
            req = None  # the shared handler answers it in the Responses API's error shape
        item = extra_item(last_user_text(req)) if req is not None else None
        if item is None:
            return await super().handle(request, path_model, stream_hint)
        assert req is not None
        self.requests += 1
        if self.require_key is not None:
            got = self.adapter.client_api_key(request.headers, request.query)
            if got is None or not hmac.compare_digest(got.encode(), self.require_key.encode()):
                return self._error(401, "invalid upstream API key", "authentication_error")
        resp = demo_reply(req, self.prefix, response_id=f"{self.prefix.strip('[]')}-{self.requests}")
        if not req.stream:
            body = _with_item_first(responses.render_response(resp, model=req.model, request=req), item)
            return web.Response(body=body, content_type="application/json")
        encoder = responses.StreamEncoder(model=req.model, request=req)
        raw = encoder.encode(demo_stream_events(resp))
        return web.Response(body=_stream_with_item_first(raw, item), content_type="text/event-stream",
                            headers={"cache-control": "no-cache"})


def make_app(name: str = "demo-responses", require_key: str | None = None, chunk_delay: float = 0.0) -> web.Application:
    demo = ResponsesDemo(responses, f"[{name}]", require_key=require_key, chunk_delay=chunk_delay)
    return demo.app(responses.PATH)


def build(argv: list[str] | None = None) -> DemoSite:
    return parse(argv, description="demo OpenAI Responses API model server", default_port=8110,
                 default_name="demo-responses", make_app=make_app)


def main(argv: list[str] | None = None) -> int:
    return serve(build(argv))


if __name__ == "__main__":
    raise SystemExit(main())
