"""Guardrail policies reload live with the rest of the config: a session driven in memory through the
Gateway snapshot a reload swaps in (extproc/live/reload.py) is blocked after the reload, not before."""

from __future__ import annotations

import copy

import orjson
import yaml

from contracts.config import parse_config
from contracts.live_config import config_version
from extproc.gateway import Gateway, LiveGateway
from extproc.live.reload import Reloader
from extproc.session import Session
from tests.core.session_driver import ROOT, ROUTES, body_msg, chat_headers, headers_msg
from tests.stack_config import without_watermarks


async def _body_reply(gw: Gateway, text: str) -> object:
    s = Session(gw, ROUTES)
    await s.handle(headers_msg(chat_headers("sk-modelyard-demo")))
    r = await s.handle(body_msg(orjson.dumps({"model": "demo-gpt", "messages": [{"role": "user", "content": text}]})))
    s.close()
    return r


async def test_a_reloaded_policy_blocks_the_next_call() -> None:
    data = without_watermarks(yaml.safe_load((ROOT / "modelyard.yaml").read_text()))
    text = yaml.safe_dump(data, sort_keys=False).encode()
    live = LiveGateway(Gateway.build(parse_config(data)), config_version(text))
    before = await _body_reply(live.current, "no codeword here: bluebird")
    assert not before.HasField("immediate_response")  # type: ignore[attr-defined]
    fresh = copy.deepcopy(data)
    fresh["guardrails"]["policies"].append({"name": "words", "applies_to": {"tenants": ["demo"]},
                                            "checks": [{"type": "deny", "words": ["bluebird"]}]})
    out = await Reloader(live).apply_text(yaml.safe_dump(fresh, sort_keys=False).encode(), source="test",
                                          origin="memory")
    assert out.ok, out.error
    after = await _body_reply(live.current, "no codeword here: bluebird")
    reply = after.immediate_response  # type: ignore[attr-defined]
    assert reply.status.code == 400 and b"'words'" in reply.body and b"bluebird" not in reply.body
