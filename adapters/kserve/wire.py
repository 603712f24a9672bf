"""KServe v2 wire constants: the gRPC service path, datatypes and their numpy dtypes, gRPC -> HTTP statuses."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from tritonclient.grpc import service_pb2 as pb

from contracts.errors import ClientError

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


@dataclass(frozen=True)
class ParsedInfer:
    """A client's infer request as a `ModelInferRequest`, plus how it wants the outputs back."""

    request: pb.ModelInferRequest
    binary_outputs: frozenset[str] = frozenset()
    binary_all: bool = False  # the request's `binary_data_output`: every output binary

    def wants_binary(self, output: str) -> bool:
        return self.binary_all or output in self.binary_outputs
