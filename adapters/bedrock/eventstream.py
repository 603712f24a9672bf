"""`application/vnd.amazon.eventstream` framing: botocore's incremental parser in, frames out.

A frame is a 12-byte prelude (total length, headers length, prelude CRC32), typed headers, the
payload, and a CRC32 over everything before it. Bytes arrive cut anywhere: a partial frame waits
for its rest. A bad CRC or an impossible length ends the stream as corrupt (the caller's 502).
"""

from __future__ import annotations

import functools
import struct
from binascii import crc32
from dataclasses import dataclass
from typing import Any

__all__ = ["Frame", "FrameDecoder", "CorruptStream", "encode_frame"]

_PRELUDE = 12
_MIN_FRAME = _PRELUDE + 4  # a frame with no headers and no payload
_STRING = 7  # header value type: UTF-8 string


class CorruptStream(Exception):
    """The bytes are not a well-formed eventstream (bad CRC, impossible lengths)."""


@dataclass(frozen=True, slots=True)
class Frame:
    headers: dict[str, object]
    payload: bytes


@functools.cache
def _buffer_class() -> type:
    """botocore's buffer, checked further; imported on first use (botocore is slow to import and
    only Bedrock deployments need it)."""
    from botocore.eventstream import EventStreamBuffer, InvalidPayloadLength

    class CheckedBuffer(EventStreamBuffer):  # type: ignore[misc]  # botocore ships no types
        # botocore bounds header and payload sizes; a total shorter than the prelude and CRC would
        # also pass its checks and then never advance the buffer: refuse that too.
        def _validate_prelude(self, prelude: Any) -> None:
            super()._validate_prelude(prelude)
            if prelude.total_length < _MIN_FRAME or prelude.headers_end > prelude.payload_end:
                raise InvalidPayloadLength(prelude.payload_length)

    return CheckedBuffer


class FrameDecoder:
    """Feed bytes as they come; get the frames they complete."""

    __slots__ = ("_buf", "pending")

    def __init__(self) -> None:
        self._buf = _buffer_class()()
        self.pending = 0  # bytes fed and not yet part of a returned frame

    def feed(self, data: bytes) -> list[Frame]:
        from botocore.eventstream import ParserError

        self._buf.add_data(data)
        self.pending += len(data)
        out: list[Frame] = []
        try:
            for msg in self._buf:
                self.pending -= msg.prelude.total_length
                out.append(Frame(msg.headers, msg.payload))
        except ParserError as e:
            raise CorruptStream(_reason(e)) from None
        return out


def _reason(e: Exception) -> str:
    name = type(e).__name__
    return "CRC mismatch" if name == "ChecksumMismatch" else f"malformed frame ({name})"


def _header(name: str, value: str) -> bytes:
    n, v = name.encode(), value.encode()
    return struct.pack("!B", len(n)) + n + struct.pack("!BH", _STRING, len(v)) + v


def encode_frame(headers: dict[str, str], payload: bytes) -> bytes:
    """One frame with string headers (what Bedrock sends: :event-type, :content-type, :message-type)."""
    hdr = b"".join(_header(k, v) for k, v in headers.items())
    total = _PRELUDE + len(hdr) + len(payload) + 4
    prelude = struct.pack("!II", total, len(hdr))
    prelude += struct.pack("!I", crc32(prelude))
    body = prelude + hdr + payload
    return body + struct.pack("!I", crc32(body))
