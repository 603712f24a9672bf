"""`ModelInferResponse` -> REST JSON (outputs as arrays, BYTES decoded, binary outputs kept binary)."""

from __future__ import annotations

import math
import struct
from typing import Any

import numpy as np
import orjson
from google.protobuf.message import DecodeError
from tritonclient.grpc import service_pb2 as pb

from adapters import kserve_binary
from adapters.kserve.status import unframe
from adapters.kserve.wire import _CONTENTS_FIELD, DATATYPES, DTYPES, ParsedInfer
from contracts.errors import UpstreamError


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
        raw: bytes = resp.raw_output_contents[index]
        return raw
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
