"""Envoy's own answer when no extproc answers: 503 with `retry-after`, in the caller's protocol's
JSON error shape, never a reset or an empty 500. Likewise Envoy's own failure of an answer that
outgrew its buffer before the extproc saw it (a chunked answer past buffer_limit_bytes): a 502 JSON
error that names the limit, not a plain-text 500.

The ext_proc filter answers a failed stream (no extproc reachable, or one that died mid-request)
with `status_on_error`; a local reply mapper, matched on the ext_proc error's response code
details, gives that reply its body and headers. The extproc's own immediate replies are local
replies too, but carry `modelyard_*` details, so the mapper leaves them alone.
"""

from __future__ import annotations

import orjson
from envoy.extensions.access_loggers.filters.cel.v3 import cel_pb2  # noqa: F401  (Any registry)
from envoy_data_plane.envoy.config.accesslog.v3 import AccessLogFilter, AndFilter, ExtensionFilter, HeaderFilter
from envoy_data_plane.envoy.config.core.v3 import (
    DataSource,
    HeaderValue,
    HeaderValueOption,
    HeaderValueOptionHeaderAppendAction,
    SubstitutionFormatString,
)
from envoy_data_plane.envoy.config.route.v3 import HeaderMatcher
from envoy_data_plane.envoy.extensions.access_loggers.filters.cel.v3 import ExpressionFilter
from envoy_data_plane.envoy.extensions.filters.network.http_connection_manager.v3 import (
    LocalReplyConfig,
    ResponseMapper,
)
from envoy_data_plane.envoy.type.matcher.v3 import RegexMatcher, StringMatcher
from envoy_data_plane.envoy.type.v3 import HttpStatus, StatusCode
from envoy_data_plane.google.protobuf import Any as AnyMsg

from adapters.error_bodies import render_error_body
from contracts.errors import answer_too_large, default_type

STATUS = 503
# The supervisor restarts a dead extproc within about a second (devstack.supervisor).
RETRY_AFTER_S = 1
MESSAGE = "the gateway's request processor is restarting; retry shortly"
# Envoy's response code details for every ext_proc failure start so (gRPC error, close, timeout).
EXTPROC_FAILED = "response.code_details.startsWith('ext_proc_error')"

# Paths (regexes on the whole :path) whose callers expect another protocol's error shape than OpenAI's (adapters.registry,
# adapters.kserve); the first that matches wins, OpenAI's shape is the rest.
_SHAPES: tuple[tuple[str, str], ...] = (
    (r"/v1/messages([?].*)?", "anthropic"),
    (r"/v1(beta)?/models/[^?]*:.*", "gemini"),
    (r"/v2/.*", "kserve"),
    (r"/v1/images/.*", "kserve"),
)


# Envoy's details when a buffered answer outgrows the stream's buffer: its local reply is a plain 500.
ANSWER_TOO_LARGE = "response.code_details == 'response_payload_too_large'"
TOO_LARGE_STATUS = 502


def status_on_error() -> HttpStatus:
    """The ext_proc filter's status for a failed stream (its default is 500)."""
    return HttpStatus(code=StatusCode(STATUS))


def _cel(expression: str) -> AccessLogFilter:
    return AccessLogFilter(extension_filter=ExtensionFilter(
        name="envoy.access_loggers.extension_filters.cel",
        typed_config=AnyMsg.pack(ExpressionFilter(expression=expression))))


def _on_path(cond: AccessLogFilter, path: str | None) -> AccessLogFilter:
    if path is None:
        return cond
    on_path = AccessLogFilter(header_filter=HeaderFilter(header=HeaderMatcher(
        name=":path", string_match=StringMatcher(safe_regex=RegexMatcher(regex=path)))))
    return AccessLogFilter(and_filter=AndFilter(filters=[cond, on_path]))


def _literal(body: bytes) -> SubstitutionFormatString:
    # A literal body: the JSON holds no `%`, so the formatter passes it through unchanged.
    return SubstitutionFormatString(text_format_source=DataSource(inline_string=body.decode()),
                                    content_type="application/json")


def _too_large_mapper(buffer_limit_bytes: int) -> ResponseMapper:
    """By the time Envoy fails the answer the extproc has rewritten :path to the upstream's, so the
    caller's protocol is not on the request any more: one body every shape's parser reads (OpenAI's
    and Gemini's `error.message`, Anthropic's `type` and `error.type`, Gemini's `error.code`)."""
    text = answer_too_large(buffer_limit_bytes)
    body = orjson.dumps({"type": "error", "error": {"message": text, "type": "api_error", "code": TOO_LARGE_STATUS,
                                                    "status": "INTERNAL"}})
    return ResponseMapper(filter=_cel(ANSWER_TOO_LARGE), status_code=TOO_LARGE_STATUS,
                          body_format_override=_literal(body))


def _mapper(protocol: str, path: str | None) -> ResponseMapper:
    failed = _on_path(_cel(EXTPROC_FAILED), path)
    body = render_error_body(protocol, STATUS, MESSAGE, default_type(STATUS)).decode()
    return ResponseMapper(
        filter=failed,
        status_code=STATUS,
        # A literal body: the JSON holds no `%`, so the formatter passes it through unchanged.
        body_format_override=SubstitutionFormatString(text_format_source=DataSource(inline_string=body),
                                                      content_type="application/json"),
        headers_to_add=[HeaderValueOption(header=HeaderValue(key="retry-after", value=str(RETRY_AFTER_S)),
                                          append_action=HeaderValueOptionHeaderAppendAction.OVERWRITE_IF_EXISTS_OR_ADD)],
    )


def extproc_down_replies(buffer_limit_bytes: int | None = None) -> LocalReplyConfig:
    """The listener's local reply config: one mapper per error shape, OpenAI's last; with
    `buffer_limit_bytes`, the too-large answer's too."""
    mappers = [*(_mapper(p, path) for path, p in _SHAPES), _mapper("openai", None)]
    if buffer_limit_bytes is not None:
        mappers.append(_too_large_mapper(buffer_limit_bytes))
    return LocalReplyConfig(mappers=mappers)
