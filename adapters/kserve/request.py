"""REST JSON infer request -> `ModelInferRequest` (every tensor as little-endian `raw_input_contents`,
BYTES as 4-byte length-prefixed elements, as Triton reads them).
"""

from __future__ import annotations

import math
import struct
from typing import Any

import numpy as np
import orjson
from tritonclient.grpc import service_pb2 as pb

from adapters import kserve_binary
from adapters.json_shape import check_shape
from adapters.kserve.response import _decode_bytes
from adapters.kserve.status import frame
from adapters.kserve.wire import DATATYPES, DTYPES, MAX_DIMS, KServeError, ParsedInfer
from adapters.limits import MAX_KSERVE_CONTAINERS, MAX_KSERVE_TENSORS, check_count
from contracts.errors import UpstreamError


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
