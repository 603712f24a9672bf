"""Text and other tensors of several callers as one `ModelInfer` (pure; docs/batching.md "KServe text
tensors"): which requests may merge, and the merged request.

A request merges when it holds one input tensor as raw contents (BYTES: 4-byte length-prefixed
elements) with no parameters anywhere: its rows are dim 0, and two requests merge when everything
else matches (input name, datatype, the shape of one row, the outputs asked for). Token-id tensors
merge at equal sequence length (the row shape), BYTES texts whatever their lengths. The reply is
cut back per caller by `slice_response`, as for images.

With a `pad` config (docs/batching.md "Padding to buckets"), token ids `[n, L]` (and their attention
mask) of any L up to the largest bucket merge with others of the same bucket (the smallest that holds
L): the merged tensor is padded to that bucket with `pad_id` (the mask with 0s); a lengths input
(`[n]` or `[n, 1]`, each row's own length) is not padded: each caller's rows keep their values. Only
calls that ask for the declared per-sequence outputs alone are padded, so every output row is one
caller's sequence.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Hashable, Sequence
from dataclasses import dataclass

import numpy as np
from tritonclient.grpc import service_pb2 as pb

from adapters.kserve.wire import DATATYPES, DTYPES
from contracts.config import BatchPadConfig

_TOKEN_TYPES = ("INT64", "INT32")  # token ids and masks that may be padded


@dataclass(frozen=True, slots=True)
class TensorRows:
    """One request's part of a merged call."""

    rows: int
    raw: bytes
    row_shape: tuple[int, ...]
    datatype: str
    variant: Hashable  # the input's name and the outputs asked for: what else must match
    seq_len: int = 0  # a padded part: its own sequence length (row_shape is the bucket's)
    inputs: tuple[bytes, ...] = ()  # a padded part: each input's raw rows, in the request's input order


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


def bucket_for(length: int, buckets: Sequence[int]) -> int | None:
    """The smallest bucket that holds `length`, None past the largest."""
    return next((b for b in buckets if b >= length), None)


def padded_rows(req: pb.ModelInferRequest, pad: BatchPadConfig) -> TensorRows | None:
    """The request's rows for a padded merge, or None when it is not token ids the config pads."""
    names = [t.name for t in req.inputs]
    wanted = {pad.input, *(n for n in (pad.mask, pad.lengths) if n is not None)}
    if req.parameters or len(names) != len(wanted) or set(names) != wanted:
        return None
    if len(req.raw_input_contents) != len(names) or not req.outputs:
        return None
    if any(o.parameters or o.name not in pad.outputs for o in req.outputs):
        return None  # an output not declared per-sequence may depend on positions: no padding
    first = req.inputs[names.index(pad.input)]
    shape = list(first.shape)
    if len(shape) != 2 or shape[0] < 1 or shape[1] < 1:
        return None
    for t, raw in zip(req.inputs, req.raw_input_contents, strict=True):
        if t.parameters or t.datatype not in _TOKEN_TYPES:
            return None
        dtype = DTYPES[t.datatype]
        if t.name == pad.lengths:
            if list(t.shape) not in ([shape[0]], [shape[0], 1]) or len(raw) != shape[0] * dtype.itemsize:
                return None
            lengths = np.frombuffer(raw, dtype=dtype)
            if (lengths < 0).any() or (lengths > shape[1]).any():
                return None  # a length past its own sequence would reach into another's padding
        elif list(t.shape) != shape or len(raw) != shape[0] * shape[1] * dtype.itemsize:
            return None
    bucket = bucket_for(shape[1], pad.buckets)
    if bucket is None:
        return None
    variant = ("pad", tuple((t.name, t.datatype, len(t.shape)) for t in req.inputs), tuple(o.name for o in req.outputs))
    return TensorRows(shape[0], b"", (bucket,), first.datatype, variant, seq_len=shape[1],
                      inputs=tuple(req.raw_input_contents))


def tensor_rows(req: pb.ModelInferRequest, pad: BatchPadConfig | None = None) -> TensorRows | None:
    """The request's rows when it may join a batch, else None (it goes alone, as sent)."""
    if pad is not None:
        padded = padded_rows(req, pad)
        if padded is not None:
            return padded
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
                          request_id: str, pad: BatchPadConfig | None = None) -> pb.ModelInferRequest:
    """`template` (any member's request: the same input and outputs) with every part's rows, in order."""
    out = pb.ModelInferRequest()
    out.CopyFrom(template)
    out.id = request_id
    if pad is not None and parts and parts[0].seq_len:
        return _merge_padded(out, parts, pad)
    out.inputs[0].shape[0] = sum(p.rows for p in parts)
    del out.raw_input_contents[:]
    out.raw_input_contents.append(b"".join(p.raw for p in parts))
    return out


def _merge_padded(out: pb.ModelInferRequest, parts: Sequence[TensorRows], pad: BatchPadConfig) -> pb.ModelInferRequest:
    """Every part's rows padded on the right to the bucket: the ids with `pad_id`, a mask with 0s; a
    lengths input's rows as each part sent them."""
    total, bucket = sum(p.rows for p in parts), parts[0].row_shape[0]
    del out.raw_input_contents[:]
    for i, t in enumerate(out.inputs):
        if t.name == pad.lengths:
            t.shape[0] = total
            out.raw_input_contents.append(b"".join(p.inputs[i] for p in parts))
            continue
        dtype = DTYPES[t.datatype]
        merged = np.full((total, bucket), pad.pad_id if t.name == pad.input else 0, dtype=dtype)
        row = 0
        for p in parts:
            merged[row:row + p.rows, :p.seq_len] = np.frombuffer(p.inputs[i], dtype=dtype).reshape(p.rows, p.seq_len)
            row += p.rows
        t.shape[:] = [total, bucket]
        out.raw_input_contents.append(merged.tobytes())
    return out
