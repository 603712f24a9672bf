"""A pure multipart/form-data parser (RFC 7578 over RFC 2046), plus the classify form reader.

Bytes and the Content-Type header in, a list of `Part`s out; no I/O, no temp files. Errors are
`MultipartError` with status 400 (malformed body, missing boundary, and a wrong content type:
the issue asks for 400 or 413, so 415 is not used) or 413 (limits).
"""

from __future__ import annotations

import re
import urllib.parse
from dataclasses import dataclass, field

from adapters.images import ImageUpload
from contracts.errors import ClientError

_TOKEN_PARAM = re.compile(
    r';\s*([!#$%&\'*+.^_`|~0-9A-Za-z-]+)\s*=\s*("(?:[^"\\]|\\.)*"|[^;\s]*)\s*'
)
_BOUNDARY_CHARS = re.compile(r"^[0-9A-Za-z'()+_,\-./:=? ]{0,69}[0-9A-Za-z'()+_,\-./:=?]$")
IMAGE_FIELD = "image"
_PADDING = re.compile(rb"[ \t]*")


class MultipartError(ClientError):
    """A form the gateway will not read; `status` is 400 (malformed) or 413 (over a limit)."""


@dataclass(frozen=True)
class MultipartLimits:
    max_body_bytes: int = 32 * 1024 * 1024
    max_parts: int = 300
    max_header_bytes: int = 8 * 1024  # per part, all header lines together
    max_field_bytes: int = 64 * 1024  # a non-file field (model, top_k) is small text


@dataclass(frozen=True)
class Part:
    name: str
    data: bytes
    filename: str | None = None
    content_type: str | None = None
    headers: dict[str, str] = field(default_factory=dict)


def parse_header_params(value: str) -> tuple[str, dict[str, str]]:
    """`type/sub; a=1; b="x y"` -> ("type/sub", {"a": "1", "b": "x y"}); names lower-cased."""
    main, _, rest = value.partition(";")
    params: dict[str, str] = {}
    for m in _TOKEN_PARAM.finditer(";" + rest):
        v = m.group(2)
        if len(v) >= 2 and v[0] == '"' and v[-1] == '"':
            v = re.sub(r"\\(.)", r"\1", v[1:-1])
        params[m.group(1).lower()] = v
    return main.strip().lower(), params


def boundary_of(content_type: str | None) -> bytes:
    """The boundary from a multipart/form-data Content-Type; MultipartError(400) otherwise."""
    if not content_type:
        raise MultipartError("missing Content-Type (multipart/form-data expected)")
    mime, params = parse_header_params(content_type)
    if mime != "multipart/form-data":
        raise MultipartError(f"Content-Type {mime or '(empty)'} is not multipart/form-data")
    b = params.get("boundary")
    if not b:
        raise MultipartError("multipart/form-data without a boundary parameter")
    if not _BOUNDARY_CHARS.match(b):
        raise MultipartError("multipart boundary is not 1-70 valid characters")
    return b.encode("ascii")


def _parse_part_headers(raw: bytes, index: int) -> dict[str, str]:
    headers: dict[str, str] = {}
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise MultipartError(f"part {index}: headers are not UTF-8") from None
    for line in text.split("\r\n"):
        if not line:
            continue
        name, sep, value = line.partition(":")
        if not sep or not name.strip() or name != name.strip():
            raise MultipartError(f"part {index}: malformed header line")
        headers[name.strip().lower()] = value.strip()
    return headers


def _disposition(headers: dict[str, str], index: int) -> tuple[str, str | None]:
    cd = headers.get("content-disposition")
    if cd is None:
        raise MultipartError(f"part {index}: missing Content-Disposition")
    kind, params = parse_header_params(cd)
    if kind != "form-data":
        raise MultipartError(f"part {index}: Content-Disposition is not form-data")
    name = params.get("name")
    if name is None:
        raise MultipartError(f"part {index}: Content-Disposition has no name")
    filename = params.get("filename")
    ext = params.get("filename*")
    if ext:
        # RFC 5987: charset'lang'pct-encoded
        charset, _, rest = ext.partition("'")
        _, _, encoded = rest.partition("'")
        try:
            filename = urllib.parse.unquote(encoded, encoding=charset or "utf-8", errors="strict")
        except (LookupError, UnicodeDecodeError):
            raise MultipartError(f"part {index}: undecodable filename*") from None
    return name, filename


def parse_multipart(body: bytes, content_type: str | None, limits: MultipartLimits = MultipartLimits()) -> list[Part]:
    """Split a multipart/form-data body into parts, in order. Strict CRLF framing."""
    boundary = boundary_of(content_type)
    if len(body) > limits.max_body_bytes:
        raise MultipartError(f"form body of {len(body)} bytes exceeds {limits.max_body_bytes}", status=413)
    delim = b"\r\n--" + boundary
    # A leading CRLF lets the first delimiter match the same pattern as the rest.
    buf = b"\r\n" + bytes(body)
    # Every part needs a delimiter: one C-speed count refuses a body of a million tiny parts
    # before any of them becomes an object (the close delimiter is the +1).
    if buf.count(delim) > limits.max_parts + 1:
        raise MultipartError(f"form has more than {limits.max_parts} parts", status=413)
    pos = buf.find(delim)
    if pos < 0:
        raise MultipartError("multipart body has no boundary delimiter")
    pos += len(delim)
    parts: list[Part] = []
    while True:
        if buf.startswith(b"--", pos):
            return parts  # close delimiter; the epilogue is ignored
        # Transport padding (LWSP) may follow a delimiter before its CRLF; a regex, not a Python
        # loop, so megabytes of padding cost milliseconds.
        pos = _PADDING.match(buf, pos).end()  # type: ignore[union-attr]
        if not buf.startswith(b"\r\n", pos):
            raise MultipartError("malformed multipart delimiter line")
        pos += 2
        end = buf.find(delim, pos)
        if end < 0:
            raise MultipartError("multipart body is truncated (no closing boundary)")
        if len(parts) >= limits.max_parts:
            raise MultipartError(f"form has more than {limits.max_parts} parts", status=413)
        index = len(parts)
        if buf.startswith(b"\r\n", pos):
            raw_headers, data_start = b"", pos + 2
        else:
            sep = buf.find(b"\r\n\r\n", pos, end)
            if sep < 0:
                raise MultipartError(f"part {index}: headers not terminated by a blank line")
            raw_headers, data_start = buf[pos:sep], sep + 4
        if len(raw_headers) > limits.max_header_bytes:
            raise MultipartError(f"part {index}: headers exceed {limits.max_header_bytes} bytes", status=413)
        headers = _parse_part_headers(raw_headers, index)
        name, filename = _disposition(headers, index)
        parts.append(Part(name, buf[data_start:end], filename, headers.get("content-type"), headers))
        pos = end + len(delim)


@dataclass(frozen=True)
class ClassifyForm:
    model: str
    images: list[ImageUpload]
    top_k: int | None = None


def read_classify_form(parts: list[Part], limits: MultipartLimits = MultipartLimits(), max_top_k: int = 1000) -> ClassifyForm:
    """Fields `model` (required, once), `image` (files, upload order kept), optional `top_k`.

    Image count limits are checked later (`adapters.images.decode_images`) because the maximum
    belongs to the model named here. Unknown fields are ignored, like most form handlers do.
    """
    model: str | None = None
    top_k: int | None = None
    images: list[ImageUpload] = []
    for p in parts:
        if p.name == IMAGE_FIELD:
            images.append(ImageUpload(len(images), p.data, p.filename, p.content_type))
            continue
        if p.name not in ("model", "top_k"):
            continue
        if len(p.data) > limits.max_field_bytes:
            raise MultipartError(f"form field {p.name!r} is too long", status=413)
        try:
            text = p.data.decode("utf-8").strip()
        except UnicodeDecodeError:
            raise MultipartError(f"form field {p.name!r} is not UTF-8 text") from None
        if p.name == "model":
            if model is not None:
                raise MultipartError("form field 'model' given more than once")
            if not text:
                raise MultipartError("form field 'model' is empty")
            model = text
        else:
            if not text.isascii() or not text.isdigit():
                raise MultipartError("form field 'top_k' must be a positive integer")
            top_k = int(text)
            if not 1 <= top_k <= max_top_k:
                raise MultipartError(f"form field 'top_k' must be between 1 and {max_top_k}")
    if model is None:
        raise MultipartError("form field 'model' is required")
    return ClassifyForm(model, images, top_k)
