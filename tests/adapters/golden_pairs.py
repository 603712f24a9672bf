"""The golden translation cases: one folder per client/upstream pair under golden/, named
`<client>-to-<upstream>`, holding `request.json`, `response-<kind>.json` and `stream-<kind>.json`.
tests/adapters/test_golden_pairs.py discovers the folders: a new protocol adds folders, not a test.

    .venv/bin/python -m tests.adapters.golden_pairs   # (re)write every folder from fixtures.py

Rewriting takes the inputs and their meaning (written by hand) from tests/adapters/fixtures.py and
the exact expected outputs from the adapters as they are now: review the diff (git diff
tests/adapters/golden) before committing it. A new protocol: add its request, responses and streams
to fixtures.py, rewrite, review the new folders.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from adapters.internal import ChatRequest, Message, TextPart
from adapters.registry import PROTOCOLS, translate_stream
from tests.adapters.translation_checks import NAMES, UPSTREAMS, client_events, parse

GOLDEN = Path(__file__).resolve().parent / "golden"
# Rendered upstream requests: the model and credential every golden request case uses.
UPSTREAM_MODEL, CREDENTIAL = "up-model", "sk-1"
CLIENT_MODEL = "client-model"
STREAM_REQUEST = ChatRequest(CLIENT_MODEL, (Message("user", (TextPart("hi"),)),), stream=True, include_usage=True)
# Stamped with the clock when rendered: left out of the comparison.
VOLATILE = frozenset({"created"})


@dataclass(frozen=True)
class Case:
    """One golden file: which pair, which kind (request, response-<k>, stream-<k>), its data."""

    client: str
    upstream: str
    path: Path

    @property
    def kind(self) -> str:
        return self.path.stem

    @property
    def id(self) -> str:
        return f"{self.path.parent.name}/{self.kind}"

    def load(self) -> dict[str, Any]:
        return json.loads(self.path.read_text())


def pair_dirs() -> list[Path]:
    return sorted(p for p in GOLDEN.iterdir() if p.is_dir() and "-to-" in p.name)


def cases(prefix: str) -> list[Case]:
    """Every golden file whose name starts with `prefix`, in every pair folder."""
    out = []
    for d in pair_dirs():
        client, _, upstream = d.name.partition("-to-")
        out += [Case(client, upstream, p) for p in sorted(d.glob(f"{prefix}*.json"))]
    return out


def scrub(obj: Any) -> Any:
    """`obj` without its VOLATILE keys, at any depth."""
    if isinstance(obj, dict):
        return {k: scrub(v) for k, v in obj.items() if k not in VOLATILE}
    if isinstance(obj, list):
        return [scrub(v) for v in obj]
    return obj


def plain(obj: Any) -> Any:
    """Tuples as lists, as JSON reads them back."""
    return orjson.loads(orjson.dumps(obj))


def render_request(client: str, upstream: str, client_body: dict) -> dict[str, Any]:
    up = PROTOCOLS[upstream].render_request(parse(client, orjson.dumps(client_body)), upstream_model=UPSTREAM_MODEL,
                                            credential=CREDENTIAL)
    return {"path": up.path, "headers": up.headers, "body": orjson.loads(up.body)}


def render_response(client: str, upstream: str, upstream_body: dict) -> bytes:
    resp = PROTOCOLS[upstream].parse_response(orjson.dumps(upstream_body))
    return PROTOCOLS[client].render_response(resp, model=CLIENT_MODEL)


def translate(client: str, upstream: str, upstream_sse: bytes, piece: int = 5):
    """The stream translator after `upstream_sse` fed in `piece`-byte reads, and what it wrote."""
    tr = translate_stream(upstream, client, STREAM_REQUEST)
    out = b"".join(tr.feed(upstream_sse[i:i + piece]) for i in range(0, len(upstream_sse), piece)) + tr.finish()
    return tr, out


def _write(path: Path, data: dict[str, Any]) -> None:
    path.write_text(json.dumps(data, indent=1, ensure_ascii=False) + "\n")


def write_all() -> None:
    from tests.adapters.fixtures import RESPONSE_MEANING, RESPONSES, STREAM_MEANING, STREAMS, request_for

    for client in NAMES:
        for upstream in UPSTREAMS:
            d = GOLDEN / f"{client}-to-{upstream}"
            d.mkdir(parents=True, exist_ok=True)
            client_req = request_for(client, upstream)
            _write(d / "request.json", {"client": client_req,
                                        "upstream": render_request(client, upstream, client_req)})
            for kind, body in RESPONSES[upstream].items():
                raw = render_response(client, upstream, body)
                _write(d / f"response-{kind}.json", {
                    "upstream": body, "client": scrub(orjson.loads(raw)),
                    "meaning": plain(RESPONSE_MEANING[kind])})
            for kind, sse in STREAMS[upstream].items():
                _, out = translate(client, upstream, sse)
                _write(d / f"stream-{kind}.json", {
                    "upstream": sse.decode(), "client": scrub(client_events(client, out)),
                    "meaning": plain(STREAM_MEANING[kind])})


if __name__ == "__main__":
    write_all()
