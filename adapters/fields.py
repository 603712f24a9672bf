"""The small validators and readers the protocol parsers share (bad input raises `ClientError`)."""

from __future__ import annotations

from collections.abc import Callable, Mapping

import orjson

from adapters.json_shape import check_shape, surely_within
from adapters.json_types import JSONArray, JSONObject
from adapters.upstream_errors import provider_message
from contracts.errors import ClientError, UpstreamError

# ---- field validation shared by the protocol parsers (each raises ClientError 400) ----------

def load_object(body: bytes, what: str = "request body", *, max_values: int | None = None) -> JSONObject:
    """Parse JSON text that must be an object; its depth (and value count) is checked first."""
    if not surely_within(body, max_values=max_values):
        check_shape(body, max_values=max_values, what=what)
    try:
        obj = orjson.loads(body)
    except (orjson.JSONDecodeError, TypeError):
        raise ClientError(f"{what} is not valid JSON") from None
    if type(obj) is not dict:
        raise ClientError(f"{what} must be a JSON object")
    return obj


def opt_str(obj: JSONObject, key: str, where: str) -> str | None:
    v = obj.get(key)
    if v is None or type(v) is str:
        return v
    raise ClientError(f"{where}.{key} must be a string")


def req_str(obj: JSONObject, key: str, where: str) -> str:
    v = obj.get(key)
    if type(v) is str and v:
        return v
    if v is None:
        raise ClientError(f"{where}.{key} is required")
    raise ClientError(f"{where}.{key} must be a non-empty string")


def opt_number(obj: JSONObject, key: str, where: str, lo: float, hi: float) -> float | None:
    v = obj.get(key)
    if v is None:
        return None
    if type(v) not in (int, float):
        raise ClientError(f"{where}.{key} must be a number")
    if not lo <= v <= hi:
        raise ClientError(f"{where}.{key} must be between {lo:g} and {hi:g}")
    return float(v)


def opt_int(obj: JSONObject, key: str, where: str, lo: int = 1) -> int | None:
    v = obj.get(key)
    if v is None:
        return None
    if type(v) is not int or v < lo:
        raise ClientError(f"{where}.{key} must be an integer >= {lo}")
    return v


def opt_bool(obj: JSONObject, key: str, where: str) -> bool:
    v = obj.get(key)
    if v is None:
        return False
    if type(v) is not bool:
        raise ClientError(f"{where}.{key} must be a boolean")
    return v


def opt_list(obj: JSONObject, key: str, where: str) -> JSONArray:
    v = obj.get(key)
    if v is None:
        return []
    if type(v) is not list:
        raise ClientError(f"{where}.{key} must be an array")
    return v


def as_object(v: object, where: str) -> JSONObject:
    if type(v) is not dict:
        raise ClientError(f"{where} must be an object")
    return v


def error_message(body: bytes, status: int) -> str:
    """The provider's sanitized message from an upstream error body, else `upstream returned HTTP n`;
    never the raw text (it may be a traceback: adapters/upstream_errors.py)."""
    return provider_message(body) or f"upstream returned HTTP {status}"


def header(headers: Mapping[str, str], name: str) -> str | None:
    """Header lookup by lower-case name, tolerant of mixed-case keys."""
    v = headers.get(name)
    if v is not None:
        return v
    for k, v in headers.items():
        if k.lower() == name:
            return v
    return None


def bad_upstream(what: str) -> UpstreamError:
    """An upstream reply we cannot read: the upstream's fault, so 502."""
    return UpstreamError(f"upstream response is invalid: {what}")


def arguments_object(arguments: str, *, name: str = "",
                     error: Callable[[str], Exception] = ClientError) -> JSONObject:
    """Tool-call arguments text as the object Anthropic and Gemini want ("" means no arguments).
    Text that is not a JSON object raises `error` (ClientError for a request, UpstreamError for
    an upstream's answer): guessing `{}` would run the tool with arguments nobody sent."""
    if not arguments.strip():
        return {}
    try:
        v = orjson.loads(arguments)
    except orjson.JSONDecodeError:
        v = None
    if type(v) is not dict:
        raise error(f"tool call {name or '?'}: arguments are not a JSON object")
    return v


def upstream_error(message: str) -> Exception:
    """`arguments_object`'s error for an upstream's reply (its fault: 502)."""
    return bad_upstream(message)


def token_count(v: object) -> int:
    """A usage count as reported, or 0 when it is missing or not a non-negative integer."""
    return v if type(v) is int and v >= 0 else 0
