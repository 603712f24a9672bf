"""KServe v2 health, readiness and metadata: the spec's shapes, pure functions.

The gateway answers these from its upstreams (`extproc/vision/kserve_probe.py` does the I/O): an
upstream's REST JSON or gRPC message is read here into one dict shape, checked against the
spec, renamed to the gateway's model name, and rendered back as REST JSON or a gRPC message.
An upstream answer that does not fit the spec is the upstream's fault (`UpstreamError`, 502).
"""

from __future__ import annotations

import urllib.parse
from typing import Any

import orjson
from google.protobuf.message import DecodeError
from tritonclient.grpc import service_pb2 as pb

from contracts.errors import UpstreamError

SERVER_NAME = "modelyard"
# Extensions the gateway itself implements on its front, whatever the upstream behind it does.
EXTENSIONS = ("binary_tensor_data", "parameters")


def server_metadata(version: str) -> dict[str, Any]:
    """`GET /v2`: the gateway's own name, version and the extensions its front speaks."""
    return {"name": SERVER_NAME, "version": version, "extensions": list(EXTENSIONS)}


def _tensor_meta(raw: Any, where: str) -> dict[str, Any]:
    if not isinstance(raw, dict):
        raise UpstreamError(f"upstream metadata {where} is not an object")
    name, datatype, shape = raw.get("name"), raw.get("datatype"), raw.get("shape")
    if not isinstance(name, str) or not isinstance(datatype, str):
        raise UpstreamError(f"upstream metadata {where}: 'name' and 'datatype' must be strings")
    if not isinstance(shape, list) or not all(isinstance(d, int) and not isinstance(d, bool) for d in shape):
        raise UpstreamError(f"upstream metadata {where}: 'shape' must be a list of integers")
    out: dict[str, Any] = {"name": name, "datatype": datatype, "shape": shape}
    if isinstance(raw.get("parameters"), dict):
        out["parameters"] = raw["parameters"]
    return out


def model_metadata(doc: Any, gateway_name: str) -> dict[str, Any]:
    """An upstream's model metadata (REST JSON, already decoded) under the gateway's model name."""
    if not isinstance(doc, dict):
        raise UpstreamError("upstream model metadata is not a JSON object")
    versions = doc.get("versions") or []
    if not isinstance(versions, list) or not all(isinstance(v, str) for v in versions):
        raise UpstreamError("upstream model metadata: 'versions' must be a list of strings")
    platform = doc.get("platform", "")
    if not isinstance(platform, str):
        raise UpstreamError("upstream model metadata: 'platform' must be a string")
    out: dict[str, Any] = {"name": gateway_name, "versions": versions, "platform": platform}
    for key in ("inputs", "outputs"):
        tensors = doc.get(key) or []
        if not isinstance(tensors, list):
            raise UpstreamError(f"upstream model metadata: '{key}' must be a list")
        out[key] = [_tensor_meta(t, f"{key}[{i}]") for i, t in enumerate(tensors)]
    if isinstance(doc.get("parameters"), dict):
        out["parameters"] = doc["parameters"]
    return out


def parse_rest_metadata(body: bytes, gateway_name: str) -> dict[str, Any]:
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError:
        raise UpstreamError("upstream model metadata is not valid JSON") from None
    return model_metadata(doc, gateway_name)


def metadata_from_grpc(resp: pb.ModelMetadataResponse, gateway_name: str) -> dict[str, Any]:
    """`ModelMetadataResponse` -> the REST shape (gRPC has no metadata parameters)."""
    return model_metadata({
        "versions": list(resp.versions), "platform": resp.platform,
        "inputs": [{"name": t.name, "datatype": t.datatype, "shape": list(t.shape)} for t in resp.inputs],
        "outputs": [{"name": t.name, "datatype": t.datatype, "shape": list(t.shape)} for t in resp.outputs],
    }, gateway_name)


def metadata_to_grpc(doc: dict[str, Any]) -> pb.ModelMetadataResponse:
    """The REST shape -> `ModelMetadataResponse` (for a gRPC caller)."""
    resp = pb.ModelMetadataResponse(name=doc["name"], versions=doc["versions"], platform=doc["platform"])
    for key, field in (("inputs", resp.inputs), ("outputs", resp.outputs)):
        for t in doc[key]:
            field.add(name=t["name"], datatype=t["datatype"], shape=t["shape"])
    return resp


def parse_grpc_message(raw: bytes, message: Any) -> Any:
    """Parse `raw` into `message` (a fresh protobuf message); a bad one is the upstream's fault."""
    try:
        message.ParseFromString(raw)
    except DecodeError:
        raise UpstreamError(f"upstream sent an invalid {type(message).__name__}") from None
    return message


def rest_model_path(upstream_model: str, version: str | None, tail: str = "") -> str:
    """`/v2/models/{m}[/versions/{v}]{tail}` with the upstream's name for the model."""
    m = urllib.parse.quote(upstream_model, safe="")
    base = f"/v2/models/{m}/versions/{urllib.parse.quote(version, safe='')}" if version else f"/v2/models/{m}"
    return base + tail
