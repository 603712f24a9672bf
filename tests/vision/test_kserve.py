from __future__ import annotations

import struct

import numpy as np
import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tritonclient.grpc import service_pb2 as pb

from adapters import kserve
from adapters.kserve import KServeError
from contracts.errors import ModelyardError, UpstreamError


def _req(inputs, **extra) -> bytes:
    return orjson.dumps({"inputs": inputs, **extra})


@pytest.mark.parametrize("datatype,data,dtype", [
    ("BOOL", [True, False, True, False], "?"),
    ("UINT8", [0, 1, 254, 255], "<u1"), ("UINT16", [0, 1, 2, 65535], "<u2"),
    ("UINT32", [0, 1, 2, 2**32 - 1], "<u4"), ("UINT64", [0, 1, 2, 2**64 - 1], "<u8"),
    ("INT8", [-128, 0, 1, 127], "<i1"), ("INT16", [-32768, 0, 1, 32767], "<i2"),
    ("INT32", [-(2**31), 0, 1, 2**31 - 1], "<i4"), ("INT64", [-(2**63), 0, 1, 2**63 - 1], "<i8"),
    ("FP16", [0.5, -1.0, 2, 65504.0], "<f2"), ("FP32", [0.1, -1.5, 3, 1e30], "<f4"),
    ("FP64", [0.1, -1.5, 3, 1e300], "<f8"),
], ids=["BOOL", "UINT8", "UINT16", "UINT32", "UINT64", "INT8", "INT16", "INT32", "INT64", "FP16", "FP32", "FP64"])
def test_numeric_datatypes_raw_little_endian(datatype, data, dtype):
    req = kserve.parse_infer_request(_req([{"name": "x", "shape": [2, 2], "datatype": datatype, "data": data}]), "m")
    assert req.model_name == "m" and req.inputs[0].datatype == datatype and list(req.inputs[0].shape) == [2, 2]
    assert req.raw_input_contents[0] == np.array(data, dtype=dtype).tobytes()


def test_nested_data_bytes_params_outputs():
    body = _req(
        [{"name": "x", "shape": [2, 3], "datatype": "FP32", "data": [[1, 2, 3], [4, 5, 6]], "parameters": {"p": 1}},
         {"name": "s", "shape": [2], "datatype": "BYTES", "data": ["héllo", ""]}],
        id="r1", parameters={"b": True, "f": 0.5, "s": "x", "big": 2**63},
        outputs=[{"name": "y", "parameters": {"binary_data": True, "classification": 2}}],
    )
    req = kserve.parse_infer_request(body, "up", "2")
    assert req.id == "r1" and req.model_version == "2"
    assert req.parameters["b"].bool_param is True and req.parameters["f"].double_param == 0.5
    assert req.parameters["big"].uint64_param == 2**63 and req.inputs[0].parameters["p"].int64_param == 1
    assert np.frombuffer(req.raw_input_contents[0], "<f4").tolist() == [1, 2, 3, 4, 5, 6]
    raw = req.raw_input_contents[1]
    assert raw == struct.pack("<I", 6) + "héllo".encode() + struct.pack("<I", 0)
    assert req.outputs[0].name == "y" and "binary_data" not in req.outputs[0].parameters
    assert req.outputs[0].parameters["classification"].int64_param == 2


@pytest.mark.parametrize("body,needle", [
    (b"not json", "not valid JSON"), (b"[]", "JSON object"), (b"{}", "inputs"),
    (_req([]), "inputs"), (_req(["x"]), "object"),
    (_req([{"name": "x", "shape": [3], "datatype": "FP32", "data": [1, 2]}]), "3 elements but data has 2"),
    (_req([{"name": "x", "shape": [2, 2], "datatype": "FP32", "data": [[1, 2, 3], [4]]}]), "regular"),
    (_req([{"name": "x", "shape": [3, 2], "datatype": "FP32", "data": [[1, 2, 3], [4, 5, 6]]}]), "does not match"),
    (_req([{"name": "x", "shape": [1], "datatype": "FP8", "data": [1]}]), "unsupported datatype"),
    (_req([{"name": "x", "shape": [1], "datatype": "INT8", "data": [128]}]), "out of range"),
    (_req([{"name": "x", "shape": [1], "datatype": "UINT8", "data": [-1]}]), "out of range"),
    (_req([{"name": "x", "shape": [1], "datatype": "INT32", "data": [1.5]}]), "integers"),
    (_req([{"name": "x", "shape": [1], "datatype": "BOOL", "data": [1]}]), "true/false"),
    (_req([{"name": "x", "shape": [1], "datatype": "FP32", "data": ["a"]}]), "numbers"),
    (_req([{"name": "x", "shape": [1], "datatype": "BYTES", "data": [1]}]), "strings"),
    (_req([{"name": "x", "shape": [-1], "datatype": "FP32", "data": []}]), "non-negative"),
    (_req([{"name": "x", "shape": "3", "datatype": "FP32", "data": [1, 2, 3]}]), "shape"),
    (_req([{"name": "x", "shape": [2**64 - 1, 0], "datatype": "FP32", "data": []}]), "64-bit"),
    (_req([{"name": "x", "shape": [1], "datatype": "FP32"}]), "'data' is required"),
    (_req([{"shape": [1], "datatype": "FP32", "data": [1]}]), "'name'"),
    (_req([{"name": "x", "shape": [1], "datatype": "FP32", "data": [1]}] * 2), "duplicate"),
    (_req([{"name": "x", "shape": [1], "datatype": "FP32", "data": [1], "parameters": {"binary_data_size": 4}}]), "binary"),
    (_req([{"name": "x", "shape": [1], "datatype": "FP32", "data": [1]}], parameters={"p": [1]}), "parameter"),
    (_req([{"name": "x", "shape": [1], "datatype": "FP32", "data": [1]}], id=5), "'id'"),
], ids=[
    "not-json", "array", "no-inputs", "empty-inputs", "input-not-object", "data-short", "ragged", "shape-mismatch",
    "unknown-datatype", "int8-overflow", "uint8-negative", "int32-fraction", "bool-as-int", "fp32-string",
    "bytes-number", "shape-negative", "shape-string", "shape-overflows", "no-data", "no-name", "duplicate-name",
    "binary-size-in-json", "bad-parameter", "id-not-string"
])
def test_malformed_requests_are_400(body, needle):
    with pytest.raises(KServeError) as e:
        kserve.parse_infer_request(body, "m")
    assert e.value.status == 400 and needle in e.value.message


def _resp() -> pb.ModelInferResponse:
    r = pb.ModelInferResponse(model_name="m", model_version="1", id="r")
    r.parameters["k"].string_param = "v"
    r.outputs.add(name="a", datatype="FP16", shape=[2])
    r.raw_output_contents.append(np.array([0.5, 1.5], "<f2").tobytes())
    r.outputs.add(name="b", datatype="BYTES", shape=[2])
    r.raw_output_contents.append(struct.pack("<I", 2) + b"hi" + struct.pack("<I", 1) + b"x")
    r.outputs.add(name="c", datatype="INT64", shape=[1, 2])
    r.raw_output_contents.append(np.array([-(2**63), 7], "<i8").tobytes())
    return r


def test_response_to_json_raw():
    doc = orjson.loads(kserve.render_infer_response(_resp()))
    assert doc["model_name"] == "m" and doc["id"] == "r" and doc["parameters"] == {"k": "v"}
    assert doc["outputs"][0] == {"name": "a", "datatype": "FP16", "shape": [2], "data": [0.5, 1.5]}
    assert doc["outputs"][1]["data"] == ["hi", "x"]
    assert doc["outputs"][2]["data"] == [-(2**63), 7]


def test_response_to_json_typed_contents():
    r = pb.ModelInferResponse(model_name="m")
    t = r.outputs.add(name="y", datatype="FP32", shape=[3])
    t.contents.fp32_contents.extend([1.0, 2.0, 3.0])
    t = r.outputs.add(name="z", datatype="BOOL", shape=[1])
    t.contents.bool_contents.append(True)
    doc = orjson.loads(kserve.render_infer_response(r))
    assert doc["outputs"][0]["data"] == [1.0, 2.0, 3.0] and doc["outputs"][1]["data"] == [True]


@pytest.mark.parametrize("mutate", [
    lambda r: r.raw_output_contents.__setitem__(0, b"\x00"),
    lambda r: r.raw_output_contents.__setitem__(1, b"\x09\x00\x00\x00hi"),
    lambda r: r.outputs[0].__setattr__("datatype", "NOPE"),
], ids=["raw-too-short", "bytes-length-past-end", "unknown-datatype"])
def test_malformed_upstream_response_is_502(mutate):
    r = _resp()
    mutate(r)
    with pytest.raises(UpstreamError) as e:
        kserve.render_infer_response(r)
    assert e.value.status == 502


def test_framing_round_trip_and_errors():
    msg = pb.ModelInferRequest(model_name="m").SerializeToString()
    framed = kserve.frame(msg)
    assert framed[:5] == b"\x00" + struct.pack(">I", len(msg)) and kserve.unframe(framed) == msg
    assert kserve.unframe(kserve.frame(b"")) == b""
    for bad, needle in [(b"", "truncated"), (b"\x00\x00\x00", "truncated"), (framed[:-1], "truncated"),
                        (b"\x01" + framed[1:], "compressed"), (b"\x07" + framed[1:], "flag"),
                        (framed + b"\x00", "more than one")]:
        with pytest.raises(UpstreamError) as e:
            kserve.unframe(bad)
        assert needle in e.value.message and e.value.status == 502


def test_parse_grpc_response():
    r = _resp()
    assert kserve.parse_grpc_response(kserve.frame(r.SerializeToString())) == r
    with pytest.raises(UpstreamError) as e:
        kserve.parse_grpc_response(kserve.frame(b"\xff\xff\xff"))
    assert e.value.status == 502


@pytest.mark.parametrize("code,status", [(3, 400), (5, 404), (14, 503), (4, 504), (8, 429), (16, 401),
                                         (7, 403), (12, 501), (13, 502), (2, 502), (99, 502), (0, 200)])
def test_grpc_status_to_http(code, status):
    assert kserve.grpc_status_to_http(code) == status


def test_grpc_status_from_headers_and_error_body():
    s = kserve.grpc_status_from_headers({"grpc-status": "5", "grpc-message": "model%20%27x%27%20not%20found"})
    assert s == kserve.GrpcStatus(5, "model 'x' not found") and s.http_status == 404
    assert orjson.loads(s.error_body()) == {"error": "model 'x' not found"}
    assert kserve.grpc_status_from_headers({"content-type": "application/grpc"}) is None
    assert kserve.grpc_status_from_headers({"grpc-status": "x"}).http_status == 502
    assert orjson.loads(kserve.render_error(400, "bad")) == {"error": "bad"}


def test_classify_request_and_response():
    from contracts.config import TensorInput
    t = np.zeros((2, 3, 4, 4), np.float16)
    req = kserve.build_classify_request("up", t, TensorInput(name="pixels", datatype="FP16"), output="probs")
    assert req.inputs[0].name == "pixels" and req.inputs[0].datatype == "FP16" and list(req.inputs[0].shape) == [2, 3, 4, 4]
    assert len(req.raw_input_contents[0]) == t.nbytes and req.outputs[0].name == "probs"
    with pytest.raises(ModelyardError) as e:
        kserve.build_classify_request("up", t, TensorInput(datatype="FP32"))
    assert e.value.status == 500
    r = pb.ModelInferResponse(model_name="up")
    r.outputs.add(name="scores", datatype="FP32", shape=[3, 3])
    r.raw_output_contents.append(np.array([[0.1, 0.7, 0.2], [0.5, 0.5, 0], [0, 0, 1]], "<f4").tobytes())
    res = kserve.parse_classify_response(r, ["a", "b"], top_k=2, expected=3)
    assert [x["label"] for x in res[0]] == ["b", "2"]  # class 2 has no label: its index
    assert [x["label"] for x in res[1]] == ["a", "b"] and res[2][0] == {"label": "2", "score": 1.0}
    with pytest.raises(UpstreamError) as e:
        kserve.parse_classify_response(r, [], 1, expected=4)
    assert e.value.status == 502
    with pytest.raises(UpstreamError) as e:
        kserve.parse_classify_response(r, [], 1, output="nope")
    assert e.value.status == 502
    doc = orjson.loads(kserve.render_classify_response("m", res[:1], ["a.png"]))
    assert doc == {"model": "m", "results": [{"index": 0, "filename": "a.png", "labels": res[0]}]}


def _reply(rows: int, classes: int = 3) -> pb.ModelInferResponse:
    resp = pb.ModelInferResponse(model_name="m", model_version="1", id="lead")
    resp.outputs.add(name="scores", datatype="FP32", shape=[rows, classes])
    resp.raw_output_contents.append(np.arange(rows * classes, dtype="<f4").tobytes())
    return resp


def test_slice_response_rows() -> None:
    resp = _reply(5)
    resp.outputs.add(name="names", datatype="BYTES", shape=[5, 1])
    resp.raw_output_contents.append(b"".join(len(s).to_bytes(4, "little") + s for s in
                                             [b"a", b"bb", b"c", b"dd", b"e"]))
    part = kserve.slice_response(resp, 1, 3, total=5, request_id="mine")
    assert part.id == "mine" and list(part.outputs[0].shape) == [3, 3]
    got = np.frombuffer(part.raw_output_contents[0], "<f4").reshape(3, 3)
    assert (got == np.arange(15, dtype="<f4").reshape(5, 3)[1:4]).all()
    assert kserve.output_array(part, 1) == ["bb", "c", "dd"]


def test_slice_response_refuses_wrong_row_count() -> None:
    with pytest.raises(ValueError):
        kserve.slice_response(_reply(4), 0, 1, total=5)


@pytest.mark.parametrize("method,path,want", [
    ("POST", "/v2/models/demo-colors/infer", ("infer", "demo-colors", None)),
    ("POST", "/v2/models/org/m:1/versions/3/infer?x=1", ("infer", "org/m:1", "3")),
    ("GET", "/v2/models/demo-colors", ("model_metadata", "demo-colors", None)),
    ("GET", "/v2/models/demo%2Fcolors/versions/1", ("model_metadata", "demo/colors", "1")),
    ("GET", "/v2/models/m/ready", ("model_ready", "m", None)),
    ("GET", "/v2/health/ready", ("health_ready", None, None)),
    ("GET", "/v2/health/live", ("health_live", None, None)),
    ("POST", "/v1/images/classify", ("classify", None, None)),
    ("POST", "/v1/chat/completions", None), ("GET", "/v2/models/", None), ("GET", "/v2", None),
], ids=[
    "infer", "versioned-infer", "metadata", "escaped-versioned-metadata", "model-ready", "health-ready",
    "health-live", "classify", "chat", "models-empty", "root"
])
def test_match_path(method, path, want):
    r = kserve.match_path(method, path)
    assert (r if r is None else (r.kind, r.model, r.version)) == want


@pytest.mark.parametrize("method,path", [("GET", "/v2/models/m/infer"), ("POST", "/v2/health/ready"),
                                         ("GET", "/v1/images/classify"), ("DELETE", "/v2/models/m")], ids=[
    "GET-infer", "POST-health", "GET-classify", "DELETE-model"
])
def test_match_path_wrong_method_405(method, path):
    with pytest.raises(KServeError) as e:
        kserve.match_path(method, path)
    assert e.value.status == 405


def test_rest_passthrough_path():
    assert kserve.rest_infer_path("a/b") == "/v2/models/a%2Fb/infer"
    assert kserve.rest_infer_path("m", "2") == "/v2/models/m/versions/2/infer"


_json = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**64 - 1) | st.floats(allow_nan=False) | st.text(max_size=5),
    lambda c: st.lists(c, max_size=4) | st.dictionaries(st.text(max_size=5), c, max_size=4), max_leaves=20)


@settings(max_examples=300, deadline=None)
@given(st.fixed_dictionaries({"inputs": st.lists(st.fixed_dictionaries({
    "name": st.sampled_from(["x", "y", 3]), "shape": st.one_of(_json, st.lists(st.integers(-1, 4) | st.sampled_from([0, 2**63, 2**64 - 1]), max_size=3)),
    "datatype": st.sampled_from(sorted(kserve.DATATYPES) + ["FP8", None]), "data": _json}), max_size=3)},
    optional={"parameters": _json, "outputs": _json, "id": _json}))
def test_fuzz_request_json_only_kserve_errors(doc):
    try:
        req = kserve.parse_infer_request(orjson.dumps(doc), "m")
    except KServeError as e:
        assert e.status == 400
        return
    for t, raw in zip(req.inputs, req.raw_input_contents):
        if t.datatype != "BYTES":
            assert len(raw) == int(np.prod(t.shape)) * kserve.DTYPES[t.datatype].itemsize


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=64))
def test_fuzz_grpc_body_only_upstream_errors(body):
    try:
        kserve.render_infer_response(kserve.parse_grpc_response(body))
    except UpstreamError as e:
        assert e.status == 502


@settings(max_examples=200, deadline=None)
@given(st.lists(st.floats(-1e6, 1e6, width=32), min_size=1, max_size=12), st.integers(1, 4))
def test_fuzz_fp32_round_trip(values, rows):
    data = values * rows
    req = kserve.parse_infer_request(_req([{"name": "x", "shape": [rows, len(values)], "datatype": "FP32", "data": data}]), "m")
    r = pb.ModelInferResponse(model_name="m")
    r.outputs.add(name="x", datatype="FP32", shape=[rows, len(values)])
    r.raw_output_contents.append(req.raw_input_contents[0])
    got = orjson.loads(kserve.render_infer_response(r))["outputs"][0]["data"]
    # orjson prints float32 in its shortest round-tripping form, so compare as float32.
    assert np.array_equal(np.array(got, np.float32), np.array(data, np.float32))
