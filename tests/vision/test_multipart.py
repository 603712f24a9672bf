from __future__ import annotations

import email.parser
import email.policy

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from adapters.multipart import (
    MultipartError,
    MultipartLimits,
    Part,
    boundary_of,
    parse_multipart,
    read_classify_form,
)
from tests.vision.formgen import build_form


def test_round_trip_fields_and_files():
    payload = b"\x00\r\n--not-a-boundary\r\n\xff" * 10
    body, ct = build_form([("model", "demo-colors", None, None), ("image", payload, "a.png", "image/png"),
                           ("image", b"second", "b.jpg", "image/jpeg"), ("top_k", "3", None, None)])
    parts = parse_multipart(body, ct)
    assert [p.name for p in parts] == ["model", "image", "image", "top_k"]
    assert parts[1].data == payload and parts[1].filename == "a.png" and parts[1].content_type == "image/png"
    form = read_classify_form(parts)
    assert form.model == "demo-colors" and form.top_k == 3
    assert [(u.index, u.filename) for u in form.images] == [(0, "a.png"), (1, "b.jpg")]


def test_quoted_boundary_preamble_epilogue_and_padding():
    body = (b"preamble\r\n--a b\t \r\nContent-Disposition: form-data; name=\"x\"\r\n\r\n1\r\n--a b--\r\nepilogue")
    parts = parse_multipart(body, 'multipart/form-data; charset=utf-8; boundary="a b"')
    assert parts == [Part("x", b"1", None, None, {"content-disposition": 'form-data; name="x"'})]


def test_filename_star_rfc5987():
    body = (b"--B\r\nContent-Disposition: form-data; name=\"image\"; filename*=UTF-8''caf%C3%A9.png\r\n\r\nx\r\n--B--")
    assert parse_multipart(body, "multipart/form-data; boundary=B")[0].filename == "café.png"


@pytest.mark.parametrize("ct", [None, "", "application/json", "multipart/mixed; boundary=x",
                                "multipart/form-data", "multipart/form-data; boundary=",
                                "multipart/form-data; boundary=" + "x" * 71], ids=[
    "none", "empty", "json", "multipart-mixed", "no-boundary", "empty-boundary", "boundary-too-long"
])
def test_bad_content_type_is_400(ct):
    with pytest.raises(MultipartError) as e:
        parse_multipart(b"--x\r\n\r\n--x--", ct)
    assert e.value.status == 400


@pytest.mark.parametrize("body", [
    b"", b"no delimiter here", b"--B", b"--Bgarbage\r\n\r\nx\r\n--B--",
    b"--B\r\nContent-Disposition: form-data; name=\"x\"\r\n\r\nunterminated",
    b"--B\r\nContent-Disposition: form-data; name=\"x\"\r\nno blank line\r\n--B--",
    b"--B\r\nContent-Type: text/plain\r\n\r\nx\r\n--B--",
    b"--B\r\nContent-Disposition: attachment; name=\"x\"\r\n\r\nx\r\n--B--",
    b"--B\r\nContent-Disposition: form-data\r\n\r\nx\r\n--B--",
    b"--B\r\nbad header line\r\n\r\nx\r\n--B--",
    b"--B\r\nContent-Disposition: form-data; name=\"\xff\"\r\n\r\nx\r\n--B--",
], ids=[
    "empty", "no-delimiter", "delimiter-only", "garbage-after-delimiter", "unterminated", "no-blank-line",
    "no-disposition", "attachment", "no-name", "bad-header-line", "name-not-utf8"
])
def test_malformed_bodies_are_400(body):
    with pytest.raises(MultipartError) as e:
        parse_multipart(body, "multipart/form-data; boundary=B")
    assert e.value.status == 400


def test_limits_are_413():
    body, ct = build_form([("image", b"x", "a", None)] * 5)
    with pytest.raises(MultipartError) as e:
        parse_multipart(body, ct, MultipartLimits(max_parts=4))
    assert e.value.status == 413
    with pytest.raises(MultipartError) as e:
        parse_multipart(body, ct, MultipartLimits(max_body_bytes=len(body) - 1))
    assert e.value.status == 413
    body, ct = build_form([("x" * 9000, b"x", None, None)])
    with pytest.raises(MultipartError) as e:
        parse_multipart(body, ct)
    assert e.value.status == 413


@pytest.mark.parametrize("fields,msg", [
    ([("image", b"x", "a.png", None)], "'model' is required"),
    ([("model", "", None, None)], "empty"),
    ([("model", "a", None, None), ("model", "b", None, None)], "more than once"),
    ([("model", "a", None, None), ("top_k", "0", None, None)], "top_k"),
    ([("model", "a", None, None), ("top_k", "-1", None, None)], "top_k"),
    ([("model", "a", None, None), ("top_k", "three", None, None)], "top_k"),
    ([("model", b"\xff", None, None)], "UTF-8"),
], ids=["no-model", "empty-model", "model-twice", "top_k-0", "top_k-negative", "top_k-word", "model-not-utf8"])
def test_classify_form_errors(fields, msg):
    body, ct = build_form(fields)
    with pytest.raises(MultipartError) as e:
        read_classify_form(parse_multipart(body, ct))
    assert e.value.status == 400 and msg in e.value.message


def test_zero_images_is_allowed_by_form_and_caught_at_decode():
    body, ct = build_form([("model", "m", None, None)])
    assert read_classify_form(parse_multipart(body, ct)).images == []


def test_boundary_of_quoted():
    assert boundary_of('multipart/form-data; boundary="abc"') == b"abc"


_names = st.text(st.characters(min_codepoint=0x20, max_codepoint=0x7E, exclude_characters='"\\'), min_size=1, max_size=12)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(_names, st.binary(max_size=64), st.one_of(st.none(), _names)), min_size=1, max_size=6))
def test_fuzz_round_trip(fields):
    body, ct = build_form([(n, v, f, None) for n, v, f in fields])
    parts = parse_multipart(body, ct)
    assert [(p.name, p.data, p.filename) for p in parts] == [(n, v, f) for n, v, f in fields]
    # The stdlib email parser reads the same body the same way.
    msg = email.parser.BytesParser(policy=email.policy.HTTP).parsebytes(
        b"Content-Type: " + ct.encode() + b"\r\n\r\n" + body)
    std = [p.get_payload(decode=True) for p in msg.iter_parts()]
    assert std == [v for _, v, _ in fields] or any(b"\r" in v or b"\n" in v for _, v, _ in fields)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=400), st.sampled_from(["B", "----x", "a b"]))
def test_fuzz_garbage_only_multipart_errors(body, boundary):
    try:
        parts = parse_multipart(body, f'multipart/form-data; boundary="{boundary}"')
        read_classify_form(parts)
    except MultipartError as e:
        assert e.status in (400, 413)


@settings(max_examples=200, deadline=None)
@given(st.integers(0, 200), st.binary(max_size=6))
def test_fuzz_mutated_valid_form(at, patch):
    body, ct = build_form([("model", "m", None, None), ("image", b"abc" * 20, "x.png", "image/png")], boundary="BND")
    at = min(at, len(body))
    mutated = body[:at] + patch + body[at + len(patch):]
    try:
        read_classify_form(parse_multipart(mutated, ct))
    except MultipartError as e:
        assert e.status in (400, 413)
