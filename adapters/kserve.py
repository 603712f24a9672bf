"""KServe v2 / Open Inference Protocol: REST JSON <-> gRPC `ModelInfer`, pure functions.

The client speaks REST JSON (`POST /v2/models/{m}/infer`); a `kserve-grpc` upstream speaks
`inference.GRPCInferenceService/ModelInfer`. This module converts the request JSON to a
`ModelInferRequest` (every tensor as `raw_input_contents`, little-endian, BYTES as 4-byte
length-prefixed elements, as Triton reads them), frames it for gRPC, unframes the reply and
renders `ModelInferResponse` back as REST JSON. gRPC statuses map to HTTP statuses. Messages
are the generated ones `tritonclient[grpc]` ships, not hand-kept protos.

A `kserve-rest` upstream needs none of this: the JSON body passes through unchanged and only
the model segment of the path is rewritten (`rest_infer_path`).

A client's input that cannot be converted raises `KServeError` (400, 405); an upstream reply
that cannot be read raises `UpstreamError` (502); our own misuse raises `ModelyardError` (500).
"""

from __future__ import annotations

import math
import re
import struct
import urllib.parse
from dataclasses import dataclass
from typing import Any, Literal, Mapping, Sequence

import numpy as np
import orjson
from google.protobuf.message import DecodeError
from tritonclient.grpc import service_pb2 as pb

from adapters import kserve_binary
from adapters.json_shape import check_shape
from adapters.limits import MAX_KSERVE_CONTAINERS, MAX_KSERVE_TENSORS, check_count
from modelyard.errors import ClientError, ModelyardError, UpstreamError

GRPC_SERVICE = "inference.GRPCInferenceService"
GRPC_INFER_PATH = f"/{GRPC_SERVICE}/ModelInfer"
GRPC_CONTENT_TYPE = "application/grpc"
MAX_DIMS = 16

# numpy dtypes for raw contents; always little-endian on the wire.
DTYPES: dict[str, np.dtype] = {
    "BOOL": np.dtype("?"),
    "UINT8": np.dtype("<u1"), "UINT16": np.dtype("<u2"), "UINT32": np.dtype("<u4"), "UINT64": np.dtype("<u8"),
    "INT8": np.dtype("<i1"), "INT16": np.dtype("<i2"), "INT32": np.dtype("<i4"), "INT64": np.dtype("<i8"),
    "FP16": np.dtype("<f2"), "FP32": np.dtype("<f4"), "FP64": np.dtype("<f8"),
}
DATATYPES = frozenset(DTYPES) | {"BYTES"}
# Which InferTensorContents field holds each datatype when typed contents are used (FP16: none).
_CONTENTS_FIELD = {
    "BOOL": "bool_contents", "INT8": "int_contents", "INT16": "int_contents", "INT32": "int_contents",
    "INT64": "int64_contents", "UINT8": "uint_contents", "UINT16": "uint_contents",
    "UINT32": "uint_contents", "UINT64": "uint64_contents", "FP32": "fp32_contents",
    "FP64": "fp64_contents", "BYTES": "bytes_contents",
}

# gRPC status code -> HTTP status. Upstream-internal failures are 502 (not the client's fault).
GRPC_TO_HTTP: dict[int, int] = {
    0: 200,    # OK
    1: 499,    # CANCELLED
    2: 502,    # UNKNOWN
    3: 400,    # INVALID_ARGUMENT
    4: 504,    # DEADLINE_EXCEEDED
    5: 404,    # NOT_FOUND
    6: 409,    # ALREADY_EXISTS
    7: 403,    # PERMISSION_DENIED
    8: 429,    # RESOURCE_EXHAUSTED
    9: 400,    # FAILED_PRECONDITION
    10: 409,   # ABORTED
    11: 400,   # OUT_OF_RANGE
    12: 501,   # UNIMPLEMENTED
    13: 502,   # INTERNAL
    14: 503,   # UNAVAILABLE
    15: 502,   # DATA_LOSS
    16: 401,   # UNAUTHENTICATED
}


class KServeError(ClientError):
    """A client request that cannot be converted; `status` is the HTTP status (400, status=405)."""


# ---------------------------------------------------------------- errors and gRPC status


def render_error(status: int, message: str, type: str | None = None) -> bytes:
    """KServe's REST error body: `{"error": "..."}` (status travels in the HTTP status line; KServe
    has no error types)."""
    return orjson.dumps({"error": message})


def grpc_status_to_http(code: int) -> int:
    return GRPC_TO_HTTP.get(int(code), 502)


@dataclass(frozen=True)
class GrpcStatus:
    code: int
    message: str

    @property
    def http_status(self) -> int:
        return grpc_status_to_http(self.code)

    def error_body(self) -> bytes:
        return render_error(self.http_status, self.message or f"upstream gRPC status {self.code}")


def grpc_status_from_headers(headers: Mapping[str, str]) -> GrpcStatus | None:
    """`grpc-status`/`grpc-message` from response headers (trailers-only reply) or trailers."""
    raw = headers.get("grpc-status")
    if raw is None:
        return None
    try:
        code = int(raw.strip())
    except ValueError:
        return GrpcStatus(2, f"upstream sent an invalid grpc-status {raw!r}")
    # grpc-message is percent-encoded UTF-8 (gRPC over HTTP/2 spec).
    message = urllib.parse.unquote(headers.get("grpc-message", ""), errors="replace")
    return GrpcStatus(code, message)


# ---------------------------------------------------------------- gRPC framing


def frame(msg: bytes) -> bytes:
    """One uncompressed gRPC length-prefixed message: flag 0, 4-byte big-endian length, body."""
    return b"\x00" + struct.pack(">I", len(msg)) + msg


def unframe(body: bytes) -> bytes:
    """The single message of a unary gRPC reply; truncation, compression or extra bytes are the upstream's fault."""
    if len(body) < 5:
        raise UpstreamError(f"gRPC body is truncated ({len(body)} bytes, no 5-byte prefix)")
    flag = body[0]
    if flag == 1:
        raise UpstreamError("gRPC message is compressed; compression is not supported")
    if flag != 0:
        raise UpstreamError(f"gRPC frame has an invalid flag byte {flag}")
    (length,) = struct.unpack_from(">I", body, 1)
    if len(body) - 5 < length:
        raise UpstreamError(f"gRPC message is truncated ({len(body) - 5} of {length} bytes)")
    if len(body) - 5 > length:
        raise UpstreamError("gRPC body holds more than one message")
    return bytes(body[5:])


# ---------------------------------------------------------------- REST JSON -> ModelInferRequest


def _set_param(target: Any, key: Any, value: Any, where: str) -> None:
    if not isinstance(key, str):
        raise KServeError(f"{where}: parameter names must be strings")
    p = target[key]
    if isinstance(value, bool):
        p.bool_param = value
    elif isinstance(value, int):
        if -(2**63) <= value < 2**63:
            p.int64_param = value
        elif 0 <= value < 2**64:
            p.uint64_param = value
        else:
            raise KServeError(f"{where}: parameter {key!r} is out of the 64-bit range")
    elif isinstance(value, float):
        p.double_param = value
    elif isinstance(value, str):
        p.string_param = value
    else:
        raise KServeError(f"{where}: parameter {key!r} must be a bool, number or string")


def _params(target: Any, params: Any, where: str) -> None:
    if params is None:
        return
    if not isinstance(params, dict):
        raise KServeError(f"{where}: parameters must be an object")
    check_count(params, MAX_KSERVE_TENSORS, f"{where}: parameters")
    for k, v in params.items():
        _set_param(target, k, v, where)


def _shape(raw: Any, where: str) -> list[int]:
    if not isinstance(raw, list) or len(raw) > MAX_DIMS:
        raise KServeError(f"{where}: shape must be a list of at most {MAX_DIMS} integers")
    for d in raw:
        if isinstance(d, bool) or not isinstance(d, int) or not 0 <= d < 2**63:
            raise KServeError(f"{where}: shape dimensions must be non-negative 64-bit integers")
    return raw


def _encode_bytes(values: list[Any], where: str) -> bytes:
    out = bytearray()
    for v in values:
        if isinstance(v, str):
            b = v.encode("utf-8")
        else:
            raise KServeError(f"{where}: BYTES data must be strings")
        out += struct.pack("<I", len(b)) + b
    return bytes(out)


def _flatten_bytes(data: Any, where: str, depth: int = 0) -> list[Any]:
    if depth > MAX_DIMS:
        raise KServeError(f"{where}: data is nested too deeply")
    if not isinstance(data, list):
        return [data]
    out: list[Any] = []
    for d in data:
        out.extend(_flatten_bytes(d, where, depth + 1) if isinstance(d, list) else [d])
    return out


def _tensor_raw(datatype: str, shape: list[int], data: Any, where: str) -> bytes:
    """Validate data against datatype and shape; return the little-endian raw bytes."""
    count = math.prod(shape)
    if not isinstance(data, list):
        raise KServeError(f"{where}: data must be a list")
    if datatype == "BYTES":
        flat = _flatten_bytes(data, where)
        if len(flat) != count:
            raise KServeError(f"{where}: shape {shape} holds {count} elements but data has {len(flat)}")
        return _encode_bytes(flat, where)
    try:
        arr = np.array(data)
    except (ValueError, TypeError, OverflowError):
        raise KServeError(f"{where}: data is not a regular array of numbers") from None
    if arr.size != count:
        raise KServeError(f"{where}: shape {shape} holds {count} elements but data has {arr.size}")
    if arr.ndim > 1 and list(arr.shape) != shape:
        raise KServeError(f"{where}: nested data shape {list(arr.shape)} does not match shape {shape}")
    target = DTYPES[datatype]
    kind = arr.dtype.kind
    if count == 0:
        return b""
    if datatype == "BOOL":
        if kind != "b":
            raise KServeError(f"{where}: BOOL data must be true/false")
    elif target.kind in "iu":
        info = np.iinfo(target)
        if kind not in "iu":
            # Values past int64 (UINT64 top half) make numpy fall back to object/float: check in Python.
            flat = _flatten_bytes(data, where)
            if not all(isinstance(v, int) and not isinstance(v, bool) for v in flat):
                raise KServeError(f"{where}: {datatype} data must be integers")
            if any(v < info.min or v > info.max for v in flat):
                raise KServeError(f"{where}: value out of range for {datatype}")
            return np.array(flat, dtype=target).tobytes()
        lo, hi = int(arr.min()), int(arr.max())
        if lo < info.min or hi > info.max:
            raise KServeError(f"{where}: value out of range for {datatype}")
    else:
        if kind not in "iuf":
            raise KServeError(f"{where}: {datatype} data must be numbers")
    with np.errstate(over="ignore"):
        return arr.astype(target).tobytes()


@dataclass(frozen=True)
class ParsedInfer:
    """A client's infer request as a `ModelInferRequest`, plus how it wants the outputs back."""

    request: pb.ModelInferRequest
    binary_outputs: frozenset[str] = frozenset()
    binary_all: bool = False  # the request's `binary_data_output`: every output binary

    def wants_binary(self, output: str) -> bool:
        return self.binary_all or output in self.binary_outputs


def _check_raw(datatype: str, shape: list[int], raw: bytes, where: str) -> bytes:
    count = math.prod(shape)
    if datatype == "BYTES":
        try:
            _decode_bytes(raw, count, where)
        except UpstreamError as e:  # the same check; here the client sent it
            raise KServeError(e.message) from None
    elif len(raw) != count * DTYPES[datatype].itemsize:
        raise KServeError(f"{where}: {len(raw)} binary bytes do not fit shape {shape} of {datatype}")
    return raw


def parse_infer_request(body: bytes, model: str, version: str = "", header_length: int | None = None
                        ) -> pb.ModelInferRequest:
    """REST v2 infer (JSON, or binary with `header_length`) -> ModelInferRequest for `model`."""
    return parse_request(body, model, version, header_length).request


def parse_request(body: bytes, model: str, version: str = "", header_length: int | None = None) -> ParsedInfer:
    """REST v2 infer -> ModelInferRequest for `model` (the upstream's name for it).

    With `header_length` (the `Inference-Header-Content-Length` header) the body is a JSON header
    followed by the binary tensors its inputs size with `binary_data_size`.
    """
    try:
        header, tail = kserve_binary.split(body, header_length)
    except kserve_binary.FramingError as e:
        raise KServeError(str(e)) from None
    # Tensor data is nested arrays, so containers (not every number) are what to bound.
    if check_shape(header).containers > MAX_KSERVE_CONTAINERS:
        raise KServeError(f"request body: more than {MAX_KSERVE_CONTAINERS} JSON arrays and objects", status=413)
    try:
        doc = orjson.loads(header)
    except orjson.JSONDecodeError as e:
        hint = f"; binary tensors need the {kserve_binary.HEADER} header" if header_length is None else ""
        raise KServeError(f"request body is not valid JSON ({e}){hint}") from None
    if not isinstance(doc, dict):
        raise KServeError("request body must be a JSON object")
    inputs = doc.get("inputs")
    if not isinstance(inputs, list) or not inputs:
        raise KServeError("'inputs' must be a non-empty list")
    check_count(inputs, MAX_KSERVE_TENSORS, "inputs")
    req = pb.ModelInferRequest(model_name=model, model_version=version)
    rid = doc.get("id")
    if rid is not None:
        if not isinstance(rid, str):
            raise KServeError("'id' must be a string")
        req.id = rid
    req_params = doc.get("parameters")
    binary_all = False
    if isinstance(req_params, dict) and "binary_data_output" in req_params:
        # A front-side choice (how we answer this caller), not something the upstream should see.
        binary_all = req_params.get("binary_data_output") is True
        req_params = {k: v for k, v in req_params.items() if k != "binary_data_output"}
    _params(req.parameters, req_params, "parameters")
    reader = kserve_binary.TailReader(tail)
    names: set[str] = set()
    for i, t in enumerate(inputs):
        where = f"inputs[{i}]"
        if not isinstance(t, dict):
            raise KServeError(f"{where}: must be an object")
        name, datatype = t.get("name"), t.get("datatype")
        if not isinstance(name, str) or not name:
            raise KServeError(f"{where}: 'name' must be a non-empty string")
        if name in names:
            raise KServeError(f"{where}: duplicate input name {name!r}")
        names.add(name)
        if datatype not in DATATYPES:
            raise KServeError(f"{where}: unsupported datatype {datatype!r} (one of {', '.join(sorted(DATATYPES))})")
        shape = _shape(t.get("shape"), where)
        params = t.get("parameters")
        if isinstance(params, dict) and kserve_binary.SIZE_PARAM in params:
            if header_length is None:
                raise KServeError(f"{where}: binary_data_size needs the {kserve_binary.HEADER} header")
            if "data" in t:
                raise KServeError(f"{where}: a binary tensor has no 'data'")
            try:
                raw = _check_raw(datatype, shape, reader.take(params[kserve_binary.SIZE_PARAM], where), where)
            except kserve_binary.FramingError as e:
                raise KServeError(str(e)) from None
            params = {k: v for k, v in params.items() if k != kserve_binary.SIZE_PARAM}
        else:
            if "data" not in t:
                raise KServeError(f"{where}: 'data' is required")
            raw = _tensor_raw(datatype, shape, t["data"], where)
        tensor = req.inputs.add(name=name, datatype=datatype, shape=shape)
        _params(tensor.parameters, params, where)
        req.raw_input_contents.append(raw)
    try:
        reader.finish()
    except kserve_binary.FramingError as e:
        raise KServeError(str(e)) from None
    binary_outputs: set[str] = set()
    outputs = doc.get("outputs")
    if outputs is not None:
        if not isinstance(outputs, list):
            raise KServeError("'outputs' must be a list")
        check_count(outputs, MAX_KSERVE_TENSORS, "outputs")
        for i, o in enumerate(outputs):
            if not isinstance(o, dict) or not isinstance(o.get("name"), str):
                raise KServeError(f"outputs[{i}]: must be an object with a string 'name'")
            out = req.outputs.add(name=o["name"])
            params = o.get("parameters")
            if isinstance(params, dict):
                # Binary or JSON is how we answer the caller; gRPC carries raw contents either way.
                if params.get("binary_data") is True:
                    binary_outputs.add(o["name"])
                params = {k: v for k, v in params.items() if k != "binary_data"}
            _params(out.parameters, params, f"outputs[{i}]")
    return ParsedInfer(req, frozenset(binary_outputs), binary_all)


def encode_infer_request(req: pb.ModelInferRequest) -> bytes:
    """The gRPC-framed request body Envoy forwards to the HTTP/2 cluster."""
    return frame(req.SerializeToString())


# ---------------------------------------------------------------- ModelInferResponse -> REST JSON


def _param_value(p: pb.InferParameter) -> Any:
    which = p.WhichOneof("parameter_choice")
    return getattr(p, which) if which else None


def _decode_bytes(raw: bytes, count: int, where: str) -> list[str]:
    out, pos = [], 0
    for _ in range(count):
        if pos + 4 > len(raw):
            raise UpstreamError(f"{where}: BYTES raw contents are truncated")
        (n,) = struct.unpack_from("<I", raw, pos)
        pos += 4
        if pos + n > len(raw):
            raise UpstreamError(f"{where}: BYTES raw contents are truncated")
        out.append(raw[pos:pos + n].decode("utf-8", errors="replace"))
        pos += n
    if pos != len(raw):
        raise UpstreamError(f"{where}: BYTES raw contents have trailing bytes")
    return out


def output_array(resp: pb.ModelInferResponse, index: int) -> np.ndarray | list[str]:
    """Output `index` as a flat array (BYTES: a list of str), validated against its shape."""
    t = resp.outputs[index]
    where = f"upstream output {t.name!r}"
    if t.datatype not in DATATYPES:
        raise UpstreamError(f"{where}: unsupported datatype {t.datatype!r}")
    if any(d < 0 for d in t.shape):
        raise UpstreamError(f"{where}: negative dimension in shape")
    count = math.prod(t.shape)
    if index < len(resp.raw_output_contents):
        raw = resp.raw_output_contents[index]
        if t.datatype == "BYTES":
            return _decode_bytes(raw, count, where)
        dt = DTYPES[t.datatype]
        if len(raw) != count * dt.itemsize:
            raise UpstreamError(f"{where}: {len(raw)} raw bytes do not fit shape {list(t.shape)} of {t.datatype}")
        return np.frombuffer(raw, dtype=dt)
    field = _CONTENTS_FIELD.get(t.datatype)
    if field is None:
        raise UpstreamError(f"{where}: {t.datatype} needs raw contents")
    values = getattr(t.contents, field)
    if len(values) != count:
        raise UpstreamError(f"{where}: {len(values)} values do not fit shape {list(t.shape)}")
    if t.datatype == "BYTES":
        return [v.decode("utf-8", errors="replace") for v in values]
    return np.array(values, dtype=DTYPES[t.datatype])


def infer_response_dict(resp: pb.ModelInferResponse) -> dict[str, Any]:
    doc: dict[str, Any] = {"model_name": resp.model_name, "model_version": resp.model_version}
    if resp.id:
        doc["id"] = resp.id
    if resp.parameters:
        doc["parameters"] = {k: _param_value(v) for k, v in resp.parameters.items()}
    outputs = []
    for i, t in enumerate(resp.outputs):
        data = output_array(resp, i)
        if isinstance(data, np.ndarray):
            # orjson serialises numpy natively; FP16 widened first for portability.
            data = data.astype(np.float32) if data.dtype == np.float16 else np.ascontiguousarray(data)
        o: dict[str, Any] = {"name": t.name, "datatype": t.datatype, "shape": list(t.shape), "data": data}
        if t.parameters:
            o["parameters"] = {k: _param_value(v) for k, v in t.parameters.items()}
        outputs.append(o)
    doc["outputs"] = outputs
    return doc


def render_infer_response(resp: pb.ModelInferResponse) -> bytes:
    return orjson.dumps(infer_response_dict(resp), option=orjson.OPT_SERIALIZE_NUMPY)


def _raw_output(resp: pb.ModelInferResponse, index: int) -> bytes:
    """Output `index` in the binary layout (validated against its shape first)."""
    data = output_array(resp, index)
    if index < len(resp.raw_output_contents):
        return resp.raw_output_contents[index]
    if isinstance(data, list):
        return b"".join(struct.pack("<I", len(b)) + b for b in (v.encode() for v in data))
    return np.ascontiguousarray(data, dtype=DTYPES[resp.outputs[index].datatype]).tobytes()


def render_infer_reply(resp: pb.ModelInferResponse, wants: ParsedInfer | None = None) -> tuple[bytes, int | None]:
    """(body, Inference-Header-Content-Length or None): each output JSON or binary as the caller asked."""
    if wants is None or not (wants.binary_all or wants.binary_outputs):
        return render_infer_response(resp), None
    doc = infer_response_dict(resp)
    blobs: list[bytes] = []
    for i, o in enumerate(doc["outputs"]):
        if wants.wants_binary(o["name"]):
            raw = _raw_output(resp, i)
            del o["data"]
            o["parameters"] = {**o.get("parameters", {}), kserve_binary.SIZE_PARAM: len(raw)}
            blobs.append(raw)
    header = orjson.dumps(doc, option=orjson.OPT_SERIALIZE_NUMPY)
    return kserve_binary.join(header, blobs)


def rename_rest_reply(body: bytes, header_length: int | None, model_name: str) -> tuple[bytes, int | None]:
    """A REST upstream's infer reply (JSON or binary) with the gateway's model name in it."""
    try:
        header, tail = kserve_binary.split(body, header_length)
        doc = orjson.loads(header)
    except (kserve_binary.FramingError, orjson.JSONDecodeError) as e:
        raise UpstreamError(f"upstream infer reply is unreadable ({e})") from None
    if not isinstance(doc, dict):
        raise UpstreamError("upstream infer reply is not a JSON object")
    doc["model_name"] = model_name
    header = orjson.dumps(doc)
    if header_length is None:
        return header, None
    return header + bytes(tail), len(header)


def parse_grpc_response(body: bytes) -> pb.ModelInferResponse:
    """A framed ModelInfer reply body -> message; malformed replies are the upstream's (502)."""
    msg = unframe(body)
    resp = pb.ModelInferResponse()
    try:
        resp.ParseFromString(msg)
    except DecodeError:
        raise UpstreamError("upstream ModelInfer reply is not a valid protobuf message") from None
    return resp


# ---------------------------------------------------------------- ModelInferRequest/Response <-> REST


def _json_values(datatype: str, raw: bytes, count: int, where: str) -> list[Any]:
    if datatype == "BYTES":
        return _decode_bytes(raw, count, where)
    arr = np.frombuffer(raw, dtype=DTYPES[datatype])
    return (arr.astype(np.float32) if datatype == "FP16" else arr).tolist()


def _request_raw(req: pb.ModelInferRequest, index: int) -> bytes:
    """Input `index` in the raw layout, whether it came as raw or typed contents."""
    if index < len(req.raw_input_contents):
        return req.raw_input_contents[index]
    t = req.inputs[index]
    field = _CONTENTS_FIELD.get(t.datatype)
    if field is None:
        raise KServeError(f"input {t.name!r}: {t.datatype} needs raw contents")
    values = list(getattr(t.contents, field))
    if t.datatype == "BYTES":
        return b"".join(struct.pack("<I", len(v)) + v for v in values)
    return np.array(values, dtype=DTYPES[t.datatype]).tobytes()


def infer_request_rest(req: pb.ModelInferRequest, *, binary: bool, binary_outputs: bool = True
                       ) -> tuple[bytes, int | None]:
    """ModelInferRequest -> a REST infer body: binary tensors when the upstream takes them, else JSON.

    `binary_outputs` asks the upstream for binary outputs (only when it takes the extension).
    """
    doc: dict[str, Any] = {}
    if req.id:
        doc["id"] = req.id
    params = {k: _param_value(v) for k, v in req.parameters.items()}
    inputs: list[dict[str, Any]] = []
    blobs: list[bytes] = []
    for i, t in enumerate(req.inputs):
        where = f"inputs[{i}]"
        raw = _check_raw(t.datatype, list(t.shape), _request_raw(req, i), where) if t.datatype in DATATYPES \
            else None
        if raw is None:
            raise KServeError(f"{where}: unsupported datatype {t.datatype!r}")
        d: dict[str, Any] = {"name": t.name, "datatype": t.datatype, "shape": list(t.shape)}
        tp = {k: _param_value(v) for k, v in t.parameters.items()}
        if binary:
            tp[kserve_binary.SIZE_PARAM] = len(raw)
            blobs.append(raw)
        else:
            d["data"] = _json_values(t.datatype, raw, math.prod(t.shape), where)
        if tp:
            d["parameters"] = tp
        inputs.append(d)
    doc["inputs"] = inputs
    if req.outputs:
        outs = []
        for o in req.outputs:
            op = {k: _param_value(v) for k, v in o.parameters.items()}
            if binary and binary_outputs:
                op["binary_data"] = True
            outs.append({"name": o.name, **({"parameters": op} if op else {})})
        doc["outputs"] = outs
    elif binary and binary_outputs:
        params["binary_data_output"] = True
    if params:
        doc["parameters"] = params
    return kserve_binary.join(orjson.dumps(doc), blobs)


def _param_into(target: Any, key: str, value: Any) -> None:
    try:
        _set_param(target, key, value, "upstream reply")
    except KServeError:
        raise UpstreamError(f"upstream reply: parameter {key!r} has an unsupported value") from None


def parse_rest_reply(body: bytes, header_length: int | None) -> pb.ModelInferResponse:
    """A REST infer reply (JSON or binary) -> ModelInferResponse with raw output contents."""
    try:
        header, tail = kserve_binary.split(body, header_length)
        doc = orjson.loads(header)
    except (kserve_binary.FramingError, orjson.JSONDecodeError) as e:
        raise UpstreamError(f"upstream infer reply is unreadable ({e})") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("outputs"), list):
        raise UpstreamError("upstream infer reply has no 'outputs' list")
    resp = pb.ModelInferResponse(model_name=str(doc.get("model_name", "")),
                                 model_version=str(doc.get("model_version") or ""), id=str(doc.get("id") or ""))
    for k, v in (doc.get("parameters") or {}).items():
        _param_into(resp.parameters, k, v)
    reader = kserve_binary.TailReader(tail)
    for i, o in enumerate(doc["outputs"]):
        where = f"upstream output {i}"
        if not isinstance(o, dict) or not isinstance(o.get("name"), str) or o.get("datatype") not in DATATYPES:
            raise UpstreamError(f"{where}: needs a string 'name' and a known 'datatype'")
        try:
            shape = _shape(o.get("shape"), where)
            params = dict(o.get("parameters") or {})
            if kserve_binary.SIZE_PARAM in params:
                raw = _check_raw(o["datatype"], shape, reader.take(params.pop(kserve_binary.SIZE_PARAM), where),
                                 where)
            else:
                raw = _tensor_raw(o["datatype"], shape, o.get("data"), where)
        except (KServeError, kserve_binary.FramingError) as e:
            raise UpstreamError(getattr(e, "message", str(e))) from None
        t = resp.outputs.add(name=o["name"], datatype=o["datatype"], shape=shape)
        for k, v in params.items():
            _param_into(t.parameters, k, v)
        resp.raw_output_contents.append(raw)
    try:
        reader.finish()
    except kserve_binary.FramingError as e:
        raise UpstreamError(str(e)) from None
    return resp


# ---------------------------------------------------------------- image classification


def build_classify_request(
    model: str, tensor: np.ndarray, spec: Any, *, input_name: str | None = None,
    output: str = "scores", request_id: str = "",
) -> pb.ModelInferRequest:
    """One NCHW tensor (from `kernels.preprocess`) -> ModelInferRequest with raw_input_contents.

    `spec` is a `TensorInput` (its `name` is the input name) or a `PreprocessSpec`.
    """
    datatype = {np.dtype(np.float32): "FP32", np.dtype(np.float16): "FP16"}.get(tensor.dtype)
    if datatype is None or tensor.ndim != 4:
        raise ModelyardError(f"classify tensor must be NCHW float32/float16, got {tensor.dtype} {tensor.shape}", status=500)
    if getattr(spec, "datatype", datatype) != datatype:
        raise ModelyardError(f"classify tensor is {datatype} but the model declares {spec.datatype}", status=500)
    name = input_name or getattr(spec, "name", "input")
    req = pb.ModelInferRequest(model_name=model, id=request_id)
    req.inputs.add(name=name, datatype=datatype, shape=list(tensor.shape))
    req.outputs.add(name=output)
    req.raw_input_contents.append(np.ascontiguousarray(tensor, dtype=DTYPES[datatype]).tobytes())
    return req


def classify_scores(resp: pb.ModelInferResponse, output: str = "scores") -> np.ndarray:
    """The [N, classes] score matrix from a ModelInfer reply (502 if the upstream got it wrong)."""
    for i, t in enumerate(resp.outputs):
        if t.name == output:
            if t.datatype not in ("FP16", "FP32", "FP64"):
                raise UpstreamError(f"upstream output {output!r} is {t.datatype}, not floating point")
            if len(t.shape) != 2:
                raise UpstreamError(f"upstream output {output!r} has shape {list(t.shape)}, not [N, classes]")
            arr = output_array(resp, i)
            return np.asarray(arr, dtype=np.float64).reshape(list(t.shape))
    raise UpstreamError(f"upstream reply has no output named {output!r}")


def top_k_labels(scores: np.ndarray, labels: Sequence[str], top_k: int) -> list[list[dict[str, Any]]]:
    """Per row, the top-k {"label", "score"} (ties keep class order); unnamed classes are their index."""
    k = max(1, min(int(top_k), scores.shape[1])) if scores.shape[1] else 0
    out = []
    for row in scores:
        order = np.argsort(-row, kind="stable")[:k]
        out.append([
            {"label": labels[j] if j < len(labels) else str(int(j)), "score": round(float(row[j]), 6)}
            for j in order
        ])
    return out


def parse_classify_response(
    resp: pb.ModelInferResponse, labels: Sequence[str], top_k: int, *, expected: int | None = None,
    output: str = "scores",
) -> list[list[dict[str, Any]]]:
    """Per image (upload order), its top-k labels. `expected` checks the image count."""
    scores = classify_scores(resp, output)
    if expected is not None and scores.shape[0] != expected:
        raise UpstreamError(f"upstream scored {scores.shape[0]} images, expected {expected}")
    return top_k_labels(scores, labels, top_k)


def slice_response(
    resp: pb.ModelInferResponse, start: int, count: int, *, total: int, request_id: str | None = None,
) -> pb.ModelInferResponse:
    """Rows [start, start+count) of every output of a batched `ModelInferResponse`.

    Every output must have `total` rows (dim 0); otherwise `ValueError` (the caller falls back).
    The slice carries its outputs as raw contents.
    """
    out = pb.ModelInferResponse(model_name=resp.model_name, model_version=resp.model_version,
                                id=resp.id if request_id is None else request_id)
    for k, v in resp.parameters.items():
        out.parameters[k].CopyFrom(v)
    if not resp.outputs:
        raise ValueError("batched reply has no outputs")
    for i, t in enumerate(resp.outputs):
        if not t.shape or t.shape[0] != total:
            raise ValueError(f"batched output {t.name!r} has shape {list(t.shape)}, expected {total} rows")
        data = output_array(resp, i)  # validated against its shape (UpstreamError otherwise)
        per_row = math.prod(t.shape[1:])
        part = data[start * per_row:(start + count) * per_row]
        o = out.outputs.add(name=t.name, datatype=t.datatype, shape=[count, *t.shape[1:]])
        for k, v in t.parameters.items():
            o.parameters[k].CopyFrom(v)
        if t.datatype == "BYTES":
            raw = b"".join(struct.pack("<I", len(s.encode())) + s.encode() for s in part)
        else:
            raw = np.ascontiguousarray(part, dtype=DTYPES[t.datatype]).tobytes()
        out.raw_output_contents.append(raw)
    return out


def render_classify_response(
    model: str, results: Sequence[Sequence[dict[str, Any]]], filenames: Sequence[str | None] | None = None,
) -> bytes:
    """`{"model", "results": [{"index", "filename", "labels": [{"label","score"}]}]}`, upload order."""
    rows = []
    for i, labels in enumerate(results):
        row: dict[str, Any] = {"index": i}
        if filenames is not None and i < len(filenames) and filenames[i]:
            row["filename"] = filenames[i]
        row["labels"] = list(labels)
        rows.append(row)
    return orjson.dumps({"model": model, "results": rows})


# ---------------------------------------------------------------- metadata, health, paths


RouteKind = Literal["infer", "model_metadata", "model_ready", "health_ready", "health_live", "classify"]


@dataclass(frozen=True)
class KServeRoute:
    kind: RouteKind
    model: str | None = None
    version: str | None = None


_MODEL_PATH = re.compile(r"^/v2/models/(?P<model>[^?#]+?)(?:/versions/(?P<version>[^/?#]+))?(?P<tail>/infer|/ready)?/?$")
_METHODS: dict[RouteKind, str] = {"infer": "POST", "model_metadata": "GET", "model_ready": "GET", "health_ready": "GET",
            "health_live": "GET", "classify": "POST"}


_TAIL_KINDS: dict[str | None, RouteKind] = {"/infer": "infer", "/ready": "model_ready", None: "model_metadata"}


def match_path(method: str, path: str) -> KServeRoute | None:
    """Which KServe/vision endpoint a request is for; None if none; 405 on a wrong method."""
    p = path.split("?", 1)[0]
    route: KServeRoute | None = None
    if p in ("/v2/health/ready", "/v2/health/ready/"):
        route = KServeRoute("health_ready")
    elif p in ("/v2/health/live", "/v2/health/live/"):
        route = KServeRoute("health_live")
    elif p in ("/v1/images/classify", "/v1/images/classify/"):
        route = KServeRoute("classify")
    else:
        m = _MODEL_PATH.match(p)
        if m:
            kind = _TAIL_KINDS[m.group("tail")]
            model = urllib.parse.unquote(m.group("model"))
            version = m.group("version")
            route = KServeRoute(kind, model, urllib.parse.unquote(version) if version else None)
    if route is None:
        return None
    want = _METHODS[route.kind]
    if method.upper() != want and not (want == "GET" and method.upper() == "HEAD"):
        raise KServeError(f"{method} is not allowed on {p} (use {want})", status=405)
    return route


def rest_infer_path(upstream_model: str, version: str | None = None) -> str:
    """REST-to-REST passthrough: the body is unchanged, only the path names the upstream model."""
    m = urllib.parse.quote(upstream_model, safe="")
    return f"/v2/models/{m}/versions/{urllib.parse.quote(version, safe='')}/infer" if version else f"/v2/models/{m}/infer"
