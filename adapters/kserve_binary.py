"""The KServe v2 binary tensor data extension: framing only, pure functions.

A binary body is a JSON header of `Inference-Header-Content-Length` bytes followed by the raw
tensors, in the order of the header's tensors that carry `parameters.binary_data_size`. Raw
bytes have the layout of gRPC's `raw_input_contents` / `raw_output_contents` (little-endian;
BYTES as 4-byte length-prefixed elements), so conversion to and from gRPC is a copy.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

HEADER = "inference-header-content-length"
CONTENT_TYPE = "application/octet-stream"
SIZE_PARAM = "binary_data_size"


class FramingError(ValueError):
    """The body does not fit its declared header length or tensor sizes (whose fault: the caller's)."""


def header_length(headers: Mapping[str, str]) -> int | None:
    """The JSON header's length from the request or reply headers; None when the body is all JSON."""
    raw = headers.get(HEADER)
    if raw is None:
        return None
    try:
        n = int(raw.strip())
    except ValueError:
        raise FramingError(f"{HEADER} {raw!r} is not an integer") from None
    if n < 0:
        raise FramingError(f"{HEADER} must not be negative")
    return n


def split(body: bytes, length: int | None) -> tuple[bytes, memoryview]:
    """(JSON header, binary tail); the tail is empty for a plain JSON body."""
    if length is None:
        return body, memoryview(b"")
    if length > len(body):
        raise FramingError(f"{HEADER} is {length} but the body has {len(body)} bytes")
    view = memoryview(body)
    return bytes(view[:length]), view[length:]


class TailReader:
    """Hands out the binary tail's tensors in order and checks that all of it was used."""

    def __init__(self, tail: memoryview) -> None:
        self.tail = tail
        self.pos = 0

    def take(self, size: object, where: str) -> bytes:
        if isinstance(size, bool) or not isinstance(size, int) or size < 0:
            raise FramingError(f"{where}: {SIZE_PARAM} must be a non-negative integer")
        if self.pos + size > len(self.tail):
            raise FramingError(f"{where}: {SIZE_PARAM} {size} runs past the end of the body")
        out = bytes(self.tail[self.pos:self.pos + size])
        self.pos += size
        return out

    def finish(self) -> None:
        if self.pos != len(self.tail):
            raise FramingError(f"{len(self.tail) - self.pos} bytes after the last binary tensor")


def join(header: bytes, blobs: Sequence[bytes]) -> tuple[bytes, int | None]:
    """(body, header length): a plain JSON body (None) when no tensor is binary."""
    if not blobs:
        return header, None
    return b"".join([header, *blobs]), len(header)
