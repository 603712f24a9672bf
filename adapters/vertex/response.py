"""Vertex AI answers: Gemini's or Anthropic's, told apart by shape (a deployment has one publisher,
but parse_response sees only the bytes). Errors are Google's `{"error": {code, message, status}}`
(or Anthropic's object for Claude); both read as the other protocols' do."""

from __future__ import annotations

from adapters import anthropic, gemini
from adapters.internal import ChatResponse
from adapters.upstream_errors import provider_message

__all__ = ["parse_response", "render_response", "render_error", "parse_error", "is_gemini"]

# Escaped inside a JSON string this reads `"candidates\":`, so only a real key matches.
_GEMINI_KEY = b'"candidates":'


def is_gemini(body: bytes) -> bool:
    return _GEMINI_KEY in body


def parse_response(body: bytes) -> ChatResponse:
    return gemini.parse_response(body) if is_gemini(body) else anthropic.parse_response(body)


# The demo upstream and a same-shape client see Gemini's (the default publisher).
render_response = gemini.render_response
render_error = gemini.render_error


def parse_error(status: int, body: bytes) -> str:
    return provider_message(body) or f"upstream returned HTTP {status}"
