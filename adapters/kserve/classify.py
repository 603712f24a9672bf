"""Image classification over KServe: the request for one image batch, top-k labels out of the scores."""

from __future__ import annotations

import math
import struct
from collections.abc import Sequence
from typing import Any

import numpy as np
import orjson
from tritonclient.grpc import service_pb2 as pb

from adapters.kserve.response import output_array
from adapters.kserve.wire import DTYPES
from contracts.errors import ModelyardError, UpstreamError


def build_classify_request(
    model: str, tensor: np.ndarray, spec: Any, *, input_name: str | None = None,
    output: str = "scores", request_id: str = "", version: str = "",
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
    req = pb.ModelInferRequest(model_name=model, model_version=version, id=request_id)
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
