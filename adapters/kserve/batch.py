"""Text and other tensors of several callers as one `ModelInfer` (pure; docs/batching.md "KServe text
tensors"): which requests may merge, and the merged request.

A request merges when it holds one input tensor as raw contents (BYTES: 4-byte length-prefixed
elements) with no parameters anywhere: its rows are dim 0, and two requests merge when everything
else matches (input name, datatype, the shape of one row, the outputs asked for). Token-id tensors
merge at equal sequence length (the row shape), BYTES texts whatever their lengths. The reply is
cut back per caller by `slice_response`, as for images.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Hashable, Sequence
from dataclasses import dataclass

from tritonclient.grpc import service_pb2 as pb

from adapters.kserve.wire import DATATYPES, DTYPES


@dataclass(frozen=True, slots=True)
class TensorRows:
    """One request's part of a merged call."""

    rows: int
    raw: bytes
    row_shape: tuple[int, ...]
    datatype: str
    variant: Hashable  # the input's name and the outputs asked for: what else must match


def _bytes_elements(raw: bytes) -> int | None:
    """How many length-prefixed elements `raw` holds exactly, None when it is not such a sequence."""
    pos = count = 0
    while pos < len(raw):
        if pos + 4 > len(raw):
            return None
        (n,) = struct.unpack_from("<I", raw, pos)
        pos += 4 + n
        count += 1
    return count if pos == len(raw) else None


def tensor_rows(req: pb.ModelInferRequest) -> TensorRows | None:
    """The request's rows when it may join a batch, else None (it goes alone, as sent)."""
    if len(req.inputs) != 1 or req.parameters or len(req.raw_input_contents) != 1:
        return None
    t = req.inputs[0]
    shape = list(t.shape)
    if t.parameters or t.datatype not in DATATYPES or not shape or shape[0] < 1 or any(d < 0 for d in shape):
        return None
    if any(o.parameters for o in req.outputs):
        return None
    raw = req.raw_input_contents[0]
    count = math.prod(shape)
    fits = _bytes_elements(raw) == count if t.datatype == "BYTES" else len(raw) == count * DTYPES[t.datatype].itemsize
    if not fits:  # a caller's tensor that lies about its size goes alone: the upstream judges it
        return None
    return TensorRows(shape[0], raw, tuple(shape[1:]), t.datatype, (t.name, tuple(o.name for o in req.outputs)))


def merge_tensor_requests(template: pb.ModelInferRequest, parts: Sequence[TensorRows],
                          request_id: str) -> pb.ModelInferRequest:
    """`template` (any member's request: the same input and outputs) with every part's rows, in order."""
    out = pb.ModelInferRequest()
    out.CopyFrom(template)
    out.id = request_id
    out.inputs[0].shape[0] = sum(p.rows for p in parts)
    del out.raw_input_contents[:]
    out.raw_input_contents.append(b"".join(p.raw for p in parts))
    return out
