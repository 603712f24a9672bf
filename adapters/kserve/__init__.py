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

from adapters.kserve.batch import TensorRows, merge_tensor_requests, tensor_rows
from adapters.kserve.classify import (
    build_classify_request,
    classify_scores,
    parse_classify_response,
    render_classify_response,
    slice_response,
    top_k_labels,
)
from adapters.kserve.paths import KServeRoute, RouteKind, match_path, rest_infer_path
from adapters.kserve.request import encode_infer_request, parse_infer_request, parse_request
from adapters.kserve.response import (
    infer_response_dict,
    output_array,
    parse_grpc_response,
    rename_rest_reply,
    render_infer_reply,
    render_infer_response,
)
from adapters.kserve.rest import infer_request_rest, parse_rest_reply
from adapters.kserve.status import (
    GrpcStatus,
    encode_grpc_message,
    frame,
    grpc_status_from_headers,
    grpc_status_to_http,
    render_error,
    unframe,
)
from adapters.kserve.wire import (
    DATATYPES,
    DTYPES,
    GRPC_CONTENT_TYPE,
    GRPC_INFER_PATH,
    GRPC_SERVICE,
    GRPC_TO_HTTP,
    MAX_DIMS,
    KServeError,
    ParsedInfer,
)

__all__ = [
    "TensorRows", "tensor_rows", "merge_tensor_requests",
    "GRPC_SERVICE", "GRPC_INFER_PATH", "GRPC_CONTENT_TYPE", "MAX_DIMS", "DTYPES", "DATATYPES", "GRPC_TO_HTTP",
    "KServeError", "render_error", "grpc_status_to_http", "GrpcStatus", "grpc_status_from_headers", "frame",
    "unframe", "encode_grpc_message", "ParsedInfer", "parse_infer_request", "parse_request", "encode_infer_request", "output_array",
    "infer_response_dict", "render_infer_response", "render_infer_reply", "rename_rest_reply",
    "parse_grpc_response", "infer_request_rest", "parse_rest_reply", "build_classify_request", "classify_scores",
    "top_k_labels", "parse_classify_response", "slice_response", "render_classify_response", "RouteKind",
    "KServeRoute", "match_path", "rest_infer_path",
]
