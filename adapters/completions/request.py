"""A Completions request parsed into a `ChatRequest`: the prompt as one user turn (render.py
writes the upstream's)."""

from __future__ import annotations

from collections.abc import Mapping

from adapters.fields import as_object, load_object, opt_bool, opt_int, opt_number
from adapters.internal import ChatRequest, Message, TextPart
from adapters.json_types import JSONObject
from adapters.limits import MAX_CHAT_JSON_VALUES, MAX_MESSAGES, check_count
from adapters.openai.request import CLIENT_AUTH_HEADERS, client_api_key
from contracts.errors import ClientError

__all__ = ["PATH", "CLIENT_AUTH_HEADERS", "DEFAULT_MAX_TOKENS", "parse_request", "client_api_key", "check_query"]

PATH = "/v1/completions"
# OpenAI's documented default (vLLM's too): a call without max_tokens gets 16 tokens, translated or not.
DEFAULT_MAX_TOKENS = 16


def _token_ids(v: object) -> bool:
    return type(v) is list and bool(v) and all(type(t) is int for t in v)


def _prompts(raw: object) -> tuple[tuple[str, ...], str | None]:
    """The prompts as text, and why only a Completions server can take them (None: a chat turn can)."""
    if type(raw) is str:
        if not raw:
            raise ClientError("prompt must not be empty")
        return (raw,), None
    if type(raw) is not list or not raw:
        raise ClientError("prompt is required: a string, an array of strings, or token ids")
    check_count(raw, MAX_MESSAGES, "prompt")
    if _token_ids(raw):  # one prompt as token ids: its text for affinity and size is the ids themselves
        return (",".join(map(str, raw)),), "a prompt of token ids"
    if all(type(p) is str for p in raw):
        texts = tuple(str(p) for p in raw)
        if any(not t for t in texts):
            raise ClientError("prompt: every prompt must be a non-empty string")
        return texts, (None if len(texts) == 1 else "several prompts in one call")
    if all(_token_ids(p) for p in raw):
        return tuple(",".join(map(str, p)) for p in raw), "prompts of token ids"
    raise ClientError("prompt must be a string, an array of strings, an array of token ids or of such arrays")


def _stop(obj: JSONObject) -> tuple[str, ...]:
    stop = obj.get("stop")
    if stop is None:
        return ()
    if type(stop) is str:
        return (stop,)
    if type(stop) is list and all(type(s) is str for s in stop):
        return tuple(stop)
    raise ClientError("stop must be a string or an array of strings")


def _top_k(obj: JSONObject) -> int | None:
    """vLLM's and SGLang's sampling field; -1 (or 0) is their "off", as good as absent."""
    v = obj.get("top_k")
    if v is None or (type(v) is int and v <= 0):
        return None
    return opt_int(obj, "top_k", "body")


def _native_only(obj: JSONObject, prompts: str | None) -> str | None:
    """What a chat turn cannot carry: the first such field, named as the caller sent it."""
    if prompts is not None:
        return prompts
    if opt_bool(obj, "echo", "body"):
        return "echo"
    if obj.get("logprobs") is not None:
        if opt_int(obj, "logprobs", "body", lo=0) is None:
            raise ClientError("body.logprobs must be an integer >= 0")
        return "logprobs"
    if obj.get("suffix") is not None:
        return "suffix"
    for name in ("n", "best_of"):
        count = opt_int(obj, name, "body")
        if count is not None and count > 1:
            return f"{name} > 1"
    return None


def parse_request(body: bytes, *, path_model: str | None = None, stream_hint: bool = False) -> ChatRequest:
    obj = load_object(body, max_values=MAX_CHAT_JSON_VALUES)
    model = obj.get("model", path_model)
    if type(model) is not str or not model:
        raise ClientError("model is required and must be a non-empty string")
    prompts, native = _prompts(obj.get("prompt"))
    so = obj.get("stream_options")
    include_usage = opt_bool(as_object(so, "stream_options"), "include_usage", "stream_options") if so is not None else False
    max_tokens = opt_int(obj, "max_tokens", "body")
    return ChatRequest(
        model=model,
        messages=tuple(Message("user", (TextPart(p),)) for p in prompts),
        temperature=opt_number(obj, "temperature", "body", 0.0, 2.0),
        top_p=opt_number(obj, "top_p", "body", 0.0, 1.0),
        max_tokens=DEFAULT_MAX_TOKENS if max_tokens is None else max_tokens,
        stop=_stop(obj),
        top_k=_top_k(obj),
        seed=opt_int(obj, "seed", "body", lo=0),
        stream=opt_bool(obj, "stream", "body") or stream_hint,
        include_usage=include_usage,
        task="completion",
        native_only=_native_only(obj, native),
    )


def check_query(query: Mapping[str, str], *, stream_hint: bool) -> None:
    """Nothing in the query string changes a Completions request."""
