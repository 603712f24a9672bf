"""Build multipart/form-data bodies for tests and benchmarks."""

from __future__ import annotations

import uuid


def build_form(fields: list[tuple[str, str | bytes, str | None, str | None]], boundary: str | None = None) -> tuple[bytes, str]:
    """fields: (name, value, filename, content_type) -> (body, content-type header)."""
    b = boundary or f"----modelyard{uuid.uuid4().hex}"
    out = bytearray()
    for name, value, filename, ctype in fields:
        out += f"--{b}\r\n".encode()
        disp = f'Content-Disposition: form-data; name="{name}"'
        if filename is not None:
            disp += f'; filename="{filename}"'
        out += disp.encode() + b"\r\n"
        if ctype:
            out += f"Content-Type: {ctype}\r\n".encode()
        out += b"\r\n"
        out += value.encode() if isinstance(value, str) else value
        out += b"\r\n"
    out += f"--{b}--\r\n".encode()
    return bytes(out), f"multipart/form-data; boundary={b}"
