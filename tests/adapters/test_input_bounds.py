"""Input bounds: JSON depth and value counts measured without parsing, structural limits per parser."""

from __future__ import annotations

import time

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from adapters import anthropic, gemini, kserve, openai
from adapters.json_shape import MAX_JSON_DEPTH, measure, surely_within
from adapters.limits import MAX_CHAT_JSON_VALUES, MAX_CONTENT_PARTS, MAX_MESSAGES, MAX_TOOLS
from adapters.multipart import MultipartLimits, parse_multipart
from contracts.errors import ClientError

SHAPE = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
# Strings full of the characters the scan must ignore inside strings.
TRICKY = st.text(alphabet=st.sampled_from(list('[]{},"\\ abc\u00e9\n')), max_size=12)
JSON = st.recursive(st.one_of(st.none(), st.booleans(), st.integers(-10**9, 10**9), TRICKY),
                    lambda c: st.one_of(st.lists(c, max_size=4), st.dictionaries(TRICKY, c, max_size=4)),
                    max_leaves=40)


def _reference(v: object, depth: int = 0) -> tuple[int, int, int]:
    """(depth, containers, values) by walking the parsed value: what `measure` must agree with."""
    if isinstance(v, (list, dict)):
        items = list(v.values()) if isinstance(v, dict) else v
        d, c, n = depth + 1, 1, 1 + max(0, len(items) - 1)  # the container plus its commas
        for x in items:
            xd, xc, xn = _reference(x, depth + 1)
            d, c, n = max(d, xd), c + xc, n + xn
        return d, c, n
    return depth, 0, 0


@SHAPE
@given(JSON, st.sampled_from([None, 2]))
def test_measure_agrees_with_a_walk_of_the_parsed_value(value: object, indent: int | None) -> None:
    body = orjson.dumps(value, option=orjson.OPT_INDENT_2 if indent else 0)
    shape = measure(body)
    assert (shape.depth, shape.containers, shape.values) == _reference(value)


@SHAPE
@given(JSON, st.integers(1, 8), st.integers(0, 60))
def test_the_byte_count_shortcut_never_passes_what_measure_refuses(value: object, max_depth: int,
                                                                   max_values: int) -> None:
    body = orjson.dumps(value)
    shape = measure(body)
    if surely_within(body, max_values=max_values, max_depth=max_depth):
        assert shape.depth <= max_depth and shape.values <= max_values


def test_the_byte_count_shortcut_takes_a_plain_chat_body() -> None:
    body = b'{"model":"m","messages":[{"role":"user","content":"hi"}]}'
    assert surely_within(body, max_values=MAX_CHAT_JSON_VALUES)
    assert not surely_within(b"[" * (MAX_JSON_DEPTH + 1) + b"]" * (MAX_JSON_DEPTH + 1))


@SHAPE
@given(st.integers(1, 300), st.sampled_from(["[", '{"k":']), TRICKY)
def test_depth_exact_for_nested_bodies(n: int, opener: str, leaf: str) -> None:
    closer = "]" if opener == "[" else "}"
    body = (opener * n + orjson.dumps(leaf).decode() + closer * n).encode()
    assert measure(body).depth == n


def test_measure_across_chunk_boundaries() -> None:
    # A run of backslashes and a quote straddling the 1 MiB chunk edge: the bracket stays in the string.
    for pad in range((1 << 20) - 6, (1 << 20) + 2):
        body = orjson.dumps({"a": "x" * pad + '\\\\\\"[[[', "b": [[1]]})
        assert measure(body).depth == 3, pad


@pytest.mark.parametrize("parse", [openai.parse_request, anthropic.parse_request, gemini.parse_request], ids=[
    "openai", "anthropic", "gemini"
])
@pytest.mark.parametrize("levels", [MAX_JSON_DEPTH + 1, 255, 300, 1024, 5000], ids=[
    "limit+1", "255", "300", "1024", "5000"
])
def test_deep_json_refused_by_every_chat_parser(parse, levels: int) -> None:
    body = b'{"model":"m","max_tokens":5,"x":' + b"[" * levels + b"]" * levels + b"}"
    with pytest.raises(ClientError) as e:
        parse(body)
    assert e.value.status == 400 and f"JSON nesting deeper than {MAX_JSON_DEPTH} levels" in e.value.message


def test_deep_json_refused_by_kserve() -> None:
    body = b'{"inputs":[{"name":"x","datatype":"FP32","shape":[1],"data":' + b"[" * 300 + b"1" + b"]" * 300 + b"}]}"
    with pytest.raises(ClientError) as e:
        kserve.parse_infer_request(body, "m")
    assert e.value.status == 400 and "JSON nesting deeper than 64 levels" in e.value.message


def test_nesting_at_the_limit_still_parses() -> None:
    # The parsers' own depth (body, tools, parameters, ...) plus a schema deep enough to reach 64 levels.
    inner = b'{"a":' * 58 + b"1" + b"}" * 58
    body = (b'{"model":"m","messages":[{"role":"user","content":"hi"}],"tools":[{"type":"function",'
            b'"function":{"name":"f","parameters":' + inner + b"}}]}")
    assert measure(body).depth <= MAX_JSON_DEPTH
    assert openai.parse_request(body).tools[0].name == "f"


def _chat(protocol: str, n_msgs: int = 1, n_parts: int = 1, n_tools: int = 0) -> bytes:
    if protocol == "gemini":
        parts = [{"text": "x"}] * n_parts
        tools = [{"functionDeclarations": [{"name": f"f{i}"} for i in range(n_tools)]}] if n_tools else []
        return orjson.dumps({"contents": [{"role": "user", "parts": parts}] * n_msgs, "tools": tools})
    parts = [{"type": "text", "text": "x"}] * n_parts
    if protocol == "openai":
        tools = [{"type": "function", "function": {"name": f"f{i}"}} for i in range(n_tools)]
    else:
        tools = [{"name": f"f{i}", "input_schema": {}} for i in range(n_tools)]
    return orjson.dumps({"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": parts}] * n_msgs,
                         "tools": tools})


PARSERS = {"openai": openai.parse_request, "anthropic": anthropic.parse_request, "gemini": gemini.parse_request}


@pytest.mark.parametrize("protocol", sorted(PARSERS))
@pytest.mark.parametrize("over,fragment", [
    ({"n_msgs": MAX_MESSAGES + 1}, "exceed the limit of"),
    ({"n_parts": MAX_CONTENT_PARTS + 1}, "exceed the limit of"),
    ({"n_tools": MAX_TOOLS + 1}, "exceed the limit of"),
], ids=["messages", "content-parts", "tools"])
def test_structure_limits(protocol: str, over: dict, fragment: str) -> None:
    parse = PARSERS[protocol]
    parse(_chat(protocol, **{k: v - 1 for k, v in over.items()}), path_model="m")  # at the limit: fine
    with pytest.raises(ClientError) as e:
        parse(_chat(protocol, **over), path_model="m")
    assert e.value.status == 413 and fragment in e.value.message


@pytest.mark.parametrize("protocol", sorted(PARSERS))
def test_a_million_tiny_values_refused_fast(protocol: str) -> None:
    body = b'{"model":"m","messages":[' + b",".join([b"{}"] * 1_000_000) + b"]}"
    # This process's CPU, not wall time: a loaded box (load 20 once failed the wall-clock bound at
    # 0.5 s) stretches the wall clock, not the work; parsing every value would cost seconds of CPU.
    t = time.process_time()
    with pytest.raises(ClientError) as e:
        PARSERS[protocol](body, path_model="m")
    elapsed = time.process_time() - t
    assert e.value.status == 413 and f"more than {MAX_CHAT_JSON_VALUES} JSON values" in e.value.message
    assert elapsed < 0.5, elapsed  # one 1 MiB chunk is scanned, nothing is parsed (~5 ms unloaded)


def test_kserve_tensor_count_limit() -> None:
    t = {"name": "x", "datatype": "FP32", "shape": [1], "data": [1]}
    body = orjson.dumps({"inputs": [{**t, "name": f"x{i}"} for i in range(65)]})
    with pytest.raises(ClientError) as e:
        kserve.parse_infer_request(body, "m")
    assert e.value.status == 413


# ---------------------------------------------------------------- multipart


def test_million_part_form_refused_before_any_part_is_built() -> None:
    body = b"".join([b'--xyz\r\nContent-Disposition: form-data; name="a"\r\n\r\n\r\n'] * 400_000) + b"--xyz--\r\n"
    t = time.process_time()  # CPU, not wall time (above)
    with pytest.raises(ClientError) as e:
        parse_multipart(body, "multipart/form-data; boundary=xyz", MultipartLimits())
    assert e.value.status == 413 and "more than 300 parts" in e.value.message
    assert time.process_time() - t < 0.5


def test_megabytes_of_transport_padding_are_cheap() -> None:
    body = b"--xyz" + b" " * 20_000_000 + b'\r\nContent-Disposition: form-data; name="a"\r\n\r\nv\r\n--xyz--'
    t = time.process_time()  # CPU, not wall time (above)
    parts = parse_multipart(body, "multipart/form-data; boundary=xyz", MultipartLimits())
    assert [p.data for p in parts] == [b"v"]
    assert time.process_time() - t < 1.0  # was ~6 s: a Python loop per padding byte


@settings(max_examples=50, deadline=None)
@given(st.integers(0, 20), st.integers(1, 10))
def test_part_count_limit_is_exact(n: int, limit: int) -> None:
    body = b"".join([b'--b\r\nContent-Disposition: form-data; name="f"\r\n\r\nx\r\n'] * n) + b"--b--\r\n"
    if n == 0:
        body = b"--b--\r\n"
    try:
        parts = parse_multipart(body, "multipart/form-data; boundary=b", MultipartLimits(max_parts=limit))
    except ClientError as e:
        assert n > limit and e.status == 413
    else:
        assert len(parts) == n <= limit
