"""Pure parsers of agent JSON and DCGM exporter text, with hypothesis fuzzing."""

import contextlib
import math

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from contracts.watermarks import WatermarkParseError, parse_agent_json
from extproc.routing.watermarks import parse_dcgm_metrics, parse_reading
from gpuagent.agent import parse_fake_spec
from tests.routing.dcgm_sample import DCGM_SAMPLE


def test_dcgm_exporter_text():
    r = parse_dcgm_metrics(DCGM_SAMPLE, now=5.0)
    assert r.source == "dcgm" and r.ts == 5.0
    assert [(g.index, g.util, g.mem_used, g.mem_total) for g in r.gpus] == [
        (0, 37.0, 10000.0, 81000.0),
        (1, 12.0, 61000.0, 81000.0),
    ]
    assert r.watermark == pytest.approx(61000 / 81000)
    assert parse_reading("dcgm", DCGM_SAMPLE.encode(), 1.0).watermark == r.watermark


def test_dcgm_util_dominates_and_odd_labels():
    text = (
        'DCGM_FI_DEV_GPU_UTIL{UUID="GPU-x",modelName="a \\"quoted\\", name"} 95 1700000000000\n'
        'DCGM_FI_DEV_FB_USED{UUID="GPU-x"} 100\nDCGM_FI_DEV_FB_FREE{UUID="GPU-x"} 900\n'
    )
    r = parse_dcgm_metrics(text)
    assert r.watermark == pytest.approx(0.95) and len(r.gpus) == 1


@pytest.mark.parametrize(
    "text",
    ["", "# only comments\n", "other_metric 1\n", "DCGM_FI_DEV_GPU_UTIL{gpu=\"0\"} abc\n",
     "DCGM_FI_DEV_GPU_UTIL{gpu=\"0\"} -1\n", "DCGM_FI_DEV_GPU_UTIL{gpu=0} 3\n",
     "DCGM_FI_DEV_FB_USED{gpu=\"0\"} NaN\n"],
 ids=[
    "empty", "only-comments", "other-metric", "util-not-number", "util-negative", "gpu-label-unquoted",
    "fb-used-nan"
])
def test_dcgm_bad_text(text):
    with pytest.raises(WatermarkParseError):
        parse_dcgm_metrics(text)


def test_agent_json():
    body = orjson.dumps(
        {
            "source": "fake",
            "gpus": [
                {"index": 0, "util": 20, "mem_used": 10, "mem_total": 100},
                {"index": 1, "util": 50, "mem_used": 70, "mem_total": 100},
            ],
            "watermark": 0.0,  # recomputed from gpus
            "ts": 1.0,
        }
    )
    r = parse_agent_json(body, now=3.0)
    assert r.watermark == pytest.approx(0.7) and r.source == "fake" and r.ts == 3.0
    assert parse_agent_json(b'{"watermark": 0.4}').watermark == 0.4


@pytest.mark.parametrize(
    "body",
    [b"", b"[]", b"null", b"{}", b'{"gpus": 3}', b'{"gpus": [1]}', b'{"watermark": 1.5}',
     b'{"gpus": [{"util": 101, "mem_used": 0, "mem_total": 1}]}',
     b'{"gpus": [{"util": 10, "mem_used": 5, "mem_total": 1}]}',
     b'{"gpus": [{"util": true, "mem_used": 0, "mem_total": 1}]}',
     b'{"gpus": [{"index": "0", "util": 1, "mem_used": 0, "mem_total": 1}]}'],
 ids=[
    "empty", "array", "null", "no-gpus", "gpus-number", "gpu-number", "watermark-over-1", "util-over-100",
    "used-over-total", "util-bool", "index-string"
])
def test_agent_json_bad(body):
    with pytest.raises(WatermarkParseError):
        parse_agent_json(body)


def _check(r):
    assert 0.0 <= r.watermark <= 1.0 and not math.isnan(r.watermark)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=300))
def test_fuzz_agent_bytes(body):
    with contextlib.suppress(WatermarkParseError):
        _check(parse_agent_json(body))


_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=5),
    lambda c: st.lists(c, max_size=4) | st.dictionaries(st.sampled_from(
        ["gpus", "util", "mem_used", "mem_total", "index", "watermark", "source", "x"]), c, max_size=5),
    max_leaves=20,
)


@settings(max_examples=300, deadline=None)
@given(_json)
def test_fuzz_agent_structures(doc):
    try:
        body = orjson.dumps(doc)
    except (orjson.JSONEncodeError, TypeError):
        return
    with contextlib.suppress(WatermarkParseError):
        _check(parse_agent_json(body))
    with contextlib.suppress(WatermarkParseError):
        parse_fake_spec(doc)


_line = st.one_of(
    st.text(max_size=60),
    st.builds(
        lambda name, labels, value: f"{name}{{{labels}}} {value}",
        st.sampled_from(["DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_FB_FREE", "DCGM_FI_DEV_X"]),
        st.text(alphabet='gpu=",\\UID0123 ', max_size=20),
        st.one_of(st.floats(allow_nan=True, allow_infinity=True).map(repr), st.text(max_size=6)),
    ),
)


@settings(max_examples=300, deadline=None)
@given(st.lists(_line, max_size=8))
def test_fuzz_dcgm(lines):
    with contextlib.suppress(WatermarkParseError):
        _check(parse_dcgm_metrics("\n".join(lines)))
