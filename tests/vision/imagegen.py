"""Small image fixtures built with Pillow in memory."""

from __future__ import annotations

import io
import struct
import zlib

from PIL import Image


def encode(colour=(255, 0, 0), size=(32, 32), fmt="PNG", mode="RGB") -> bytes:
    buf = io.BytesIO()
    img = Image.new(mode, size, colour)
    img.save(buf, fmt, **({"quality": 95} if fmt == "JPEG" else {}))
    return buf.getvalue()


def png_bomb(width: int, height: int) -> bytes:
    """A tiny PNG whose header declares width x height (IDAT holds almost nothing)."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(b"\x00" * 16)) + chunk(b"IEND", b"")
