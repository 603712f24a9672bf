"""KServe errors and gRPC statuses (from headers or trailers) and the gRPC length-prefixed framing."""

from __future__ import annotations

import struct
import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass

import orjson

from adapters.kserve.wire import GRPC_TO_HTTP
from contracts.errors import UpstreamError


def render_error(status: int, message: str, type: str | None = None) -> bytes:
    """KServe's REST error body: `{"error": "..."}` (status travels in the HTTP status line; KServe
    has no error types)."""
    return orjson.dumps({"error": message})


def grpc_status_to_http(code: int) -> int:
    return GRPC_TO_HTTP.get(int(code), 502)


@dataclass(frozen=True)
class GrpcStatus:
    code: int
    message: str

    @property
    def http_status(self) -> int:
        return grpc_status_to_http(self.code)

    def error_body(self) -> bytes:
        return render_error(self.http_status, self.message or f"upstream gRPC status {self.code}")


def grpc_status_from_headers(headers: Mapping[str, str]) -> GrpcStatus | None:
    """`grpc-status`/`grpc-message` from response headers (trailers-only reply) or trailers."""
    raw = headers.get("grpc-status")
    if raw is None:
        return None
    try:
        code = int(raw.strip())
    except ValueError:
        return GrpcStatus(2, f"upstream sent an invalid grpc-status {raw!r}")
    # grpc-message is percent-encoded UTF-8 (gRPC over HTTP/2 spec).
    message = urllib.parse.unquote(headers.get("grpc-message", ""), errors="replace")
    return GrpcStatus(code, message)


# grpc-message is percent-encoded: everything printable but '%' passes as is.
_MESSAGE_SAFE = "".join(chr(c) for c in range(0x20, 0x7F) if chr(c) != "%")


def encode_grpc_message(text: str) -> str:
    """A `grpc-message` value, as `grpc_status_from_headers` reads it back."""
    return urllib.parse.quote(text, safe=_MESSAGE_SAFE)


def frame(msg: bytes) -> bytes:
    """One uncompressed gRPC length-prefixed message: flag 0, 4-byte big-endian length, body."""
    return struct.pack(">BI", 0, len(msg)) + msg  # one copy of the body


def unframe(body: bytes) -> bytes:
    """The single message of a unary gRPC reply; truncation, compression or extra bytes are the upstream's fault."""
    if len(body) < 5:
        raise UpstreamError(f"gRPC body is truncated ({len(body)} bytes, no 5-byte prefix)")
    flag = body[0]
    if flag == 1:
        raise UpstreamError("gRPC message is compressed; compression is not supported")
    if flag != 0:
        raise UpstreamError(f"gRPC frame has an invalid flag byte {flag}")
    (length,) = struct.unpack_from(">I", body, 1)
    if len(body) - 5 < length:
        raise UpstreamError(f"gRPC message is truncated ({len(body) - 5} of {length} bytes)")
    if len(body) - 5 > length:
        raise UpstreamError("gRPC body holds more than one message")
    return bytes(body[5:])
