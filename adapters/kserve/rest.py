"""`ModelInferRequest` -> REST JSON for a `kserve-rest` upstream, and its REST reply back to `ModelInferResponse`."""

from __future__ import annotations

import math
import struct
from typing import Any

import numpy as np
import orjson
from tritonclient.grpc import service_pb2 as pb

from adapters import kserve_binary
from adapters.kserve.request import _check_raw, _set_param, _shape, _tensor_raw
from adapters.kserve.response import _decode_bytes, _param_value
from adapters.kserve.wire import _CONTENTS_FIELD, DATATYPES, DTYPES, KServeError
from contracts.errors import UpstreamError


def _json_values(datatype: str, raw: bytes, count: int, where: str) -> list[Any]:
    if datatype == "BYTES":
        return _decode_bytes(raw, count, where)
    arr = np.frombuffer(raw, dtype=DTYPES[datatype])
    values: list[Any] = (arr.astype(np.float32) if datatype == "FP16" else arr).tolist()
    return values


def _request_raw(req: pb.ModelInferRequest, index: int) -> bytes:
    """Input `index` in the raw layout, whether it came as raw or typed contents."""
    if index < len(req.raw_input_contents):
        raw: bytes = req.raw_input_contents[index]
        return raw
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
