"""Upstream answers larger than `extproc.max_body_bytes`: decided on their response headers, before
Envoy buffers a byte of the body.

An answer the caller takes as it is (same protocol) is passed through untranslated: Envoy streams
it on and the extproc never sees the body (ext_proc body mode NONE for this response). One that
would need translating cannot be, and gets a 502 in the caller's shape that names the limit; so
does a translation that comes out past the limit (OpenAI's base64 vectors become Gemini's JSON
floats, about 1.8 times the bytes). An answer without a content-length (chunked) is buffered as usual: past Envoy's buffer_limit_bytes
Envoy fails it itself, before the extproc sees its body; the listener's local-reply mapper makes
that a 502 naming the limit (controlplane/local_replies.py; docs/performance.md, "Large bodies").
"""

from __future__ import annotations

from collections.abc import Mapping

from extproc import messages as msg
from extproc.context import RequestContext
from extproc.errors import render_error_body
from extproc.flows.upstream import ROUTE_ANSWER_HEADERS
from extproc.telemetry.metrics import ANSWERS_OVER_LIMIT


def oversized(headers: Mapping[str, str], limit: int) -> int | None:
    """The answer's declared length when it is past `limit`, else None."""
    raw = headers.get("content-length", "")
    if not raw.isdigit():
        return None
    n = int(raw)
    return n if n > limit else None


def count(model: str, deployment: str, outcome: str) -> None:
    ANSWERS_OVER_LIMIT.labels(model, deployment, outcome).inc()


def refusal_text(nbytes: int, limit: int, upstream: str, client: str, *, translated: bool = False) -> str:
    what = f"the answer translated to {client}" if translated else "the upstream's answer"
    return (f"{what} ({nbytes} bytes) is larger than this gateway translates (extproc.max_body_bytes = "
            f"{limit}) from {upstream} to {client}: ask for less (fewer inputs, dimensions or tokens)")


def _reply(ctx: RequestContext, text: str, details: str) -> msg.ProcessingResponse:
    """A 502 in place of the upstream's answer, less the headers the route stamped on it for us."""
    r = msg.immediate(502, render_error_body(ctx.protocol, 502, text, "api_error"),
                      [("content-type", "application/json"), *ctx.task_headers()], details=details)
    r.immediate_response.headers.remove_headers.extend(ROUTE_ANSWER_HEADERS)
    return r


def refusal(ctx: RequestContext, nbytes: int, limit: int, upstream: str) -> msg.ProcessingResponse:
    """The 502 for an answer too large to translate, in the caller's protocol."""
    return _reply(ctx, refusal_text(nbytes, limit, upstream, ctx.protocol), "modelyard_answer_over_max_body_bytes")
