"""KServe v2 gRPC on the gateway's front (`inference.GRPCInferenceService`), pure functions.

A gRPC caller's unary request arrives as one length-prefixed message on
`POST /inference.GRPCInferenceService/<Method>`; errors go back as a gRPC status with a message.
"""

from __future__ import annotations

from typing import Any

from google.protobuf.message import DecodeError
from tritonclient.grpc import service_pb2 as pb

from adapters import kserve
from adapters.kserve import KServeError
from contracts.errors import UpstreamError

PATH_PREFIX = f"/{kserve.GRPC_SERVICE}/"
INFER = "ModelInfer"
# Answered by the gateway from its upstreams' answers (no inference): see extproc/flows/kserve_grpc.py.
ANSWERED = frozenset({"ServerLive", "ServerReady", "ServerMetadata", "ModelReady", "ModelMetadata"})

# HTTP status of a gateway error -> gRPC status code (the inverse of kserve.GRPC_TO_HTTP, where it
# is one to one; gateway timeouts and dead upstreams read as a client retry would expect).
HTTP_TO_GRPC: dict[int, int] = {
    400: 3, 401: 16, 403: 7, 404: 5, 405: 12, 409: 10, 413: 8, 422: 3, 429: 8, 499: 1,
    500: 13, 501: 12, 502: 14, 503: 14, 504: 4,
}


def method_of(path: str) -> str | None:
    """`ModelInfer` for `/inference.GRPCInferenceService/ModelInfer`; None for any other path."""
    if not path.startswith(PATH_PREFIX):
        return None
    method = path[len(PATH_PREFIX):]
    return method if method == INFER or method in ANSWERED else None


def grpc_code(http_status: int) -> int:
    if http_status in HTTP_TO_GRPC:
        return HTTP_TO_GRPC[http_status]
    return 3 if 400 <= http_status < 500 else 13 if http_status < 600 else 2


def render_error(status: int, message: str, type: str | None = None) -> bytes:
    """A gRPC caller's error text: it travels as grpc-message, beside `grpc_code(status)`."""
    return message.encode()


def parse_infer(body: bytes) -> pb.ModelInferRequest:
    """A caller's framed ModelInferRequest; a bad frame or message is the caller's fault (400)."""
    try:
        raw = kserve.unframe(body)
    except UpstreamError as e:  # the same framing rules, the other side's fault
        raise KServeError(e.message.replace("gRPC", "gRPC request")) from None
    req = pb.ModelInferRequest()
    try:
        req.ParseFromString(raw)
    except DecodeError:
        raise KServeError("request is not a valid ModelInferRequest") from None
    if not req.model_name:
        raise KServeError("ModelInferRequest.model_name is required")
    if not req.inputs:
        raise KServeError("ModelInferRequest.inputs must not be empty")
    if req.raw_input_contents and len(req.raw_input_contents) != len(req.inputs):
        raise KServeError(f"{len(req.raw_input_contents)} raw_input_contents for {len(req.inputs)} inputs")
    return req


def render(message: Any) -> bytes:
    """One framed reply message."""
    return kserve.frame(message.SerializeToString())
