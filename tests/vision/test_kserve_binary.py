"""The binary tensor extension, pure: bodies built and read by tritonclient's own HTTP encoder and
decoder (`generate_request_body`, `parse_response_body`), so the framing is the client's, not ours."""

from __future__ import annotations

import numpy as np
import orjson
import pytest
from tritonclient.grpc import service_pb2 as pb
from tritonclient.http import InferenceServerClient, InferInput, InferRequestedOutput

from adapters import kserve, kserve_binary, kserve_meta
from adapters.kserve import KServeError
from contracts.errors import UpstreamError

ARRAYS = {
    "FP32": np.arange(12, dtype=np.float32).reshape(3, 4) / 7,
    "FP16": np.array([[0.5, -2.0]], dtype=np.float16),
    "INT64": np.array([[-(2**40), 7]], dtype=np.int64),
    "UINT8": np.array([1, 2, 255], dtype=np.uint8),
    "BOOL": np.array([True, False]),
    "BYTES": np.array([b"caf\xc3\xa9", b"", b"x"], dtype=np.object_),
}


def _input(name: str, datatype: str, binary: bool) -> InferInput:
    arr = ARRAYS[datatype]
    i = InferInput(name, list(arr.shape), datatype)
    i.set_data_from_numpy(arr, binary_data=binary)
    return i


def _client_body(inputs, outputs=None, **kw) -> tuple[bytes, int | None]:
    body, json_size = InferenceServerClient.generate_request_body(inputs, outputs=outputs, **kw)
    return body, json_size


def _expected_raw(datatype: str) -> bytes:
    arr = ARRAYS[datatype]
    if datatype == "BYTES":
        return b"".join(len(v).to_bytes(4, "little") + v for v in arr.ravel())
    return arr.astype(kserve.DTYPES[datatype]).tobytes()


@pytest.mark.parametrize("datatype", sorted(ARRAYS))
def test_binary_request_from_tritonclient_parses_to_raw_contents(datatype: str) -> None:
    body, size = _client_body([_input("x", datatype, True), _input("j", "FP32", False)])
    assert size is not None
    parsed = kserve.parse_request(body, "up", "2", size)
    req = parsed.request
    assert (req.model_name, req.model_version) == ("up", "2")
    assert [t.name for t in req.inputs] == ["x", "j"]
    assert list(req.inputs[0].shape) == list(ARRAYS[datatype].shape)
    assert req.raw_input_contents[0] == _expected_raw(datatype)
    assert req.raw_input_contents[1] == _expected_raw("FP32")
    assert "binary_data_size" not in req.inputs[0].parameters
    # No outputs named: tritonclient asks for every output binary.
    assert parsed.binary_all and "binary_data_output" not in req.parameters


def test_json_and_binary_requests_carry_the_same_tensors() -> None:
    a = kserve.parse_infer_request(*_body_and_none(_client_body([_input("x", "FP32", False)])), header_length=None)
    body, size = _client_body([_input("x", "FP32", True)])
    b = kserve.parse_infer_request(body, "m", "", size)
    assert a.raw_input_contents == b.raw_input_contents


def _body_and_none(pair: tuple[bytes, int | None]) -> tuple[bytes, str]:
    assert pair[1] is None
    return pair[0], "m"


@pytest.mark.parametrize("mutate,needle", [
    (lambda b, n: (b, n + 1000), "body has"),
    (lambda b, n: (b[:-1], n), "runs past"),
    (lambda b, n: (b + b"\0", n), "after the last binary tensor"),
    (lambda b, n: (b, None), "binary tensors need the inference-header-content-length header"),
], ids=["header-length-past-body", "tensor-runs-past", "trailing-byte", "no-header-length"])
def test_broken_binary_framing_is_400(mutate, needle: str) -> None:
    body, size = _client_body([_input("x", "FP32", True)])
    body, size = mutate(body, size)
    with pytest.raises(KServeError) as e:
        kserve.parse_request(body, "m", "", size)
    assert e.value.status == 400 and needle in e.value.message


def test_binary_size_that_does_not_fit_the_shape_is_400() -> None:
    header = orjson.dumps({"inputs": [{"name": "x", "datatype": "FP32", "shape": [2],
                                       "parameters": {"binary_data_size": 4}}]})
    with pytest.raises(KServeError, match="do not fit shape"):
        kserve.parse_request(header + b"\0" * 4, "m", "", len(header))


def _reply() -> pb.ModelInferResponse:
    resp = pb.ModelInferResponse(model_name="m", model_version="1", id="r1")
    for name, dt in (("probs", "FP32"), ("label", "BYTES"), ("half", "FP16")):
        arr = ARRAYS[dt]
        resp.outputs.add(name=name, datatype=dt, shape=list(arr.shape))
        resp.raw_output_contents.append(_expected_raw(dt))
    return resp


@pytest.mark.parametrize("asked", [None, ["probs"], ["probs", "label", "half"]], ids=[
    "binary_data_output", "one-output", "every-output"
])
def test_reply_binary_as_asked_and_tritonclient_reads_it(asked) -> None:
    if asked is None:  # no outputs named: binary_data_output
        body, size = _client_body([_input("x", "FP32", True)])
    else:
        outs = [InferRequestedOutput(n, binary_data=True) for n in asked]
        body, size = _client_body([_input("x", "FP32", True)], outputs=outs + [InferRequestedOutput("zz", False)])
    parsed = kserve.parse_request(body, "m", "", size)
    reply, length = kserve.render_infer_reply(_reply(), parsed)
    assert length is not None
    result = InferenceServerClient.parse_response_body(reply, header_length=length)
    np.testing.assert_array_equal(result.as_numpy("probs"), ARRAYS["FP32"])
    # JSON BYTES come back as str, binary ones as bytes: the same UTF-8 either way.
    labels = [v if isinstance(v, bytes) else v.encode() for v in result.as_numpy("label").ravel()]
    assert labels == list(ARRAYS["BYTES"].ravel())
    half = result.as_numpy("half")
    binary_names = {o["name"] for o in result.get_response()["outputs"]
                    if "binary_data_size" in o.get("parameters", {})}
    assert binary_names == set(asked or ["probs", "label", "half"])
    np.testing.assert_array_equal(half.astype(np.float32), ARRAYS["FP16"].astype(np.float32))


def test_reply_is_json_when_nothing_binary_was_asked() -> None:
    body, size = _client_body([_input("x", "FP32", False)], outputs=[InferRequestedOutput("probs", binary_data=False)])
    assert size is None
    reply, length = kserve.render_infer_reply(_reply(), kserve.parse_request(body, "m"))
    assert length is None and orjson.loads(reply)["outputs"][0]["data"][:2] == pytest.approx([0, 1 / 7])


@pytest.mark.parametrize("binary", [True, False])
def test_grpc_request_to_rest_and_back(binary: bool) -> None:
    body, size = _client_body([_input("x", "INT64", True), _input("s", "BYTES", True)])
    req = kserve.parse_request(body, "m", "", size).request
    rest, length = kserve.infer_request_rest(req, binary=binary)
    assert (length is not None) == binary
    again = kserve.parse_request(rest, "m", "", length)
    assert again.request.raw_input_contents == req.raw_input_contents
    assert again.binary_all == binary


def test_rest_reply_to_model_infer_response() -> None:
    reply, length = kserve.render_infer_reply(_reply(), kserve.ParsedInfer(pb.ModelInferRequest(),
                                                                           frozenset({"label"})))
    resp = kserve.parse_rest_reply(reply, length)
    assert [o.name for o in resp.outputs] == ["probs", "label", "half"]
    assert list(resp.raw_output_contents) == list(_reply().raw_output_contents)
    assert (resp.model_name, resp.model_version, resp.id) == ("m", "1", "r1")


def test_rename_rest_reply_keeps_binary_tail() -> None:
    parsed = kserve.ParsedInfer(pb.ModelInferRequest(), frozenset(), binary_all=True)
    reply, length = kserve.render_infer_reply(_reply(), parsed)
    renamed, new_length = kserve.rename_rest_reply(reply, length, "a-much-longer-gateway-name")
    result = InferenceServerClient.parse_response_body(renamed, header_length=new_length)
    assert result.get_response()["model_name"] == "a-much-longer-gateway-name"
    np.testing.assert_array_equal(result.as_numpy("probs"), ARRAYS["FP32"])


@pytest.mark.parametrize("body,length", [(b"{}", None), (b"not json", None), (b'{"outputs": []}', 99)])
def test_unreadable_rest_replies_are_502(body: bytes, length: int | None) -> None:
    with pytest.raises(UpstreamError):
        kserve.parse_rest_reply(body, length)


def test_header_length_header() -> None:
    assert kserve_binary.header_length({}) is None
    assert kserve_binary.header_length({"inference-header-content-length": " 12 "}) == 12
    for bad in ("x", "-1"):
        with pytest.raises(kserve_binary.FramingError):
            kserve_binary.header_length({"inference-header-content-length": bad})


def test_metadata_from_rest_and_grpc_carry_the_gateway_name() -> None:
    doc = {"name": "iris", "versions": ["v1"], "platform": "sklearn",
           "inputs": [{"name": "x", "datatype": "FP64", "shape": [-1, 4]}],
           "outputs": [{"name": "y", "datatype": "INT64", "shape": [-1, 1]}]}
    rest = kserve_meta.parse_rest_metadata(orjson.dumps(doc), "tabular")
    grpc = kserve_meta.metadata_from_grpc(kserve_meta.metadata_to_grpc({**doc}), "tabular")
    assert rest == grpc == {**doc, "name": "tabular"}


@pytest.mark.parametrize("doc", [[], {"versions": "1"}, {"inputs": [{"name": "x"}]}, {"platform": 3},
                                 {"outputs": [{"name": "y", "datatype": "FP32", "shape": ["a"]}]}], ids=[
    "array", "versions-string", "input-no-datatype", "platform-number", "shape-strings"
])
def test_off_spec_metadata_is_the_upstreams_fault(doc) -> None:
    with pytest.raises(UpstreamError):
        kserve_meta.model_metadata(doc, "m")
