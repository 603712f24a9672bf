"""OpenAI's legacy Completions API (POST /v1/completions) <-> internal format, pure functions.

A client protocol like the chat APIs: the `prompt` becomes one user turn, the answer goes back as
a `text_completion` object (or its SSE chunks). Two ways upstream: a deployment that serves
`/v1/completions` itself (vLLM, SGLang, TGI; a model listing the `completion` task type) gets the
client's own bytes; any other chat deployment gets the prompt as a chat turn, where that means
the same call. What only a Completions server can do (`echo`, `logprobs`, `suffix`, `best_of`,
`n` > 1, token-id prompts, several prompts) marks the request native-only: a 400 where it would
be translated.
"""

from __future__ import annotations

from adapters.completions.render import passthrough_body, render_request, request_target, unsupported_controls
from adapters.completions.request import CLIENT_AUTH_HEADERS, PATH, check_query, client_api_key, parse_request
from adapters.completions.response import parse_response, render_response
from adapters.completions.stream import StreamDecoder, StreamEncoder
from adapters.openai.errors import parse_error, render_error

__all__ = [
    "PATH", "CLIENT_AUTH_HEADERS", "parse_request", "request_target", "render_request", "parse_response",
    "render_response", "StreamDecoder", "StreamEncoder", "render_error", "parse_error", "client_api_key",
    "check_query", "passthrough_body", "unsupported_controls",
]
