"""Envoy's access log, text or JSON: what a request line records, and what it never may.

Paths are logged without their query string (Gemini callers send `?key=API_KEY`), and no format
names a credential header (authorization, x-api-key, x-goog-api-key)."""

from __future__ import annotations

from envoy.extensions.formatter.req_without_query.v3 import req_without_query_pb2  # noqa: F401  (Any registry)
from envoy_data_plane.envoy.config.accesslog.v3 import AccessLog
from envoy_data_plane.envoy.config.core.v3 import DataSource, SubstitutionFormatString, TypedExtensionConfig
from envoy_data_plane.envoy.extensions.access_loggers.file.v3 import FileAccessLog
from envoy_data_plane.envoy.extensions.formatter.req_without_query.v3 import ReqWithoutQuery
from envoy_data_plane.google.protobuf import Any as AnyMsg
from envoy_data_plane.google.protobuf import Struct

from controlplane.environments import AccessLogSettings

# The path as the client sent it, minus `?...`: query strings can carry credentials.
PATH = "%REQ_WITHOUT_QUERY(X-ENVOY-ORIGINAL-PATH?:PATH)%"

JSON_FIELDS = {
    "time": "%START_TIME%", "method": "%REQ(:METHOD)%", "path": PATH, "protocol": "%PROTOCOL%",
    "status": "%RESPONSE_CODE%", "duration_ms": "%DURATION%", "client": "%DOWNSTREAM_REMOTE_ADDRESS_WITHOUT_PORT%",
    "cluster": "%UPSTREAM_CLUSTER%", "upstream_host": "%UPSTREAM_HOST%", "flags": "%RESPONSE_FLAGS%",
    "attempts": "%UPSTREAM_REQUEST_ATTEMPT_COUNT%", "task_id": "%RESP(X-MODELYARD-TASK-ID)%",
    "bytes_in": "%BYTES_RECEIVED%", "bytes_out": "%BYTES_SENT%", "user_agent": "%REQ(USER-AGENT)%",
}

# Envoy's default line, with the query-less path and the gateway's fields; no request headers but the agent.
TEXT_FORMAT = ('[%START_TIME%] "%REQ(:METHOD)% ' + PATH + ' %PROTOCOL%" %RESPONSE_CODE% %RESPONSE_FLAGS% '
               '%BYTES_RECEIVED% %BYTES_SENT% %DURATION% "%DOWNSTREAM_REMOTE_ADDRESS_WITHOUT_PORT%" '
               '"%REQ(USER-AGENT)%" "%REQ(:AUTHORITY)%" cluster=%UPSTREAM_CLUSTER% upstream=%UPSTREAM_HOST% '
               'attempts=%UPSTREAM_REQUEST_ATTEMPT_COUNT% task=%RESP(X-MODELYARD-TASK-ID)%\n')


def access_log(settings: AccessLogSettings) -> AccessLog:
    fmt = SubstitutionFormatString(formatters=[TypedExtensionConfig(
        name="envoy.formatter.req_without_query", typed_config=AnyMsg.pack(ReqWithoutQuery()))])
    if settings.format == "json":
        fmt.json_format = Struct.from_dict(JSON_FIELDS)
    else:
        fmt.text_format_source = DataSource(inline_string=TEXT_FORMAT)
    return AccessLog(name="envoy.access_loggers.file",
                     typed_config=AnyMsg.pack(FileAccessLog(path=settings.path, log_format=fmt)))
