"""KServe v2 routes: which infer, metadata or health path a request is, and the upstream infer path."""

from __future__ import annotations

import re
import urllib.parse
from dataclasses import dataclass
from typing import Literal

from adapters.kserve.wire import KServeError

RouteKind = Literal["infer", "model_metadata", "model_ready", "health_ready", "health_live", "classify"]


@dataclass(frozen=True)
class KServeRoute:
    kind: RouteKind
    model: str | None = None
    version: str | None = None


_MODEL_PATH = re.compile(r"^/v2/models/(?P<model>[^?#]+?)(?:/versions/(?P<version>[^/?#]+))?(?P<tail>/infer|/ready)?/?$")
_METHODS: dict[RouteKind, str] = {"infer": "POST", "model_metadata": "GET", "model_ready": "GET", "health_ready": "GET",
            "health_live": "GET", "classify": "POST"}


_TAIL_KINDS: dict[str | None, RouteKind] = {"/infer": "infer", "/ready": "model_ready", None: "model_metadata"}


def match_path(method: str, path: str) -> KServeRoute | None:
    """Which KServe/vision endpoint a request is for; None if none; 405 on a wrong method."""
    p = path.split("?", 1)[0]
    route: KServeRoute | None = None
    if p in ("/v2/health/ready", "/v2/health/ready/"):
        route = KServeRoute("health_ready")
    elif p in ("/v2/health/live", "/v2/health/live/"):
        route = KServeRoute("health_live")
    elif p in ("/v1/images/classify", "/v1/images/classify/"):
        route = KServeRoute("classify")
    else:
        m = _MODEL_PATH.match(p)
        if m:
            kind = _TAIL_KINDS[m.group("tail")]
            model = urllib.parse.unquote(m.group("model"))
            version = m.group("version")
            route = KServeRoute(kind, model, urllib.parse.unquote(version) if version else None)
    if route is None:
        return None
    want = _METHODS[route.kind]
    if method.upper() != want and not (want == "GET" and method.upper() == "HEAD"):
        raise KServeError(f"{method} is not allowed on {p} (use {want})", status=405)
    return route


def rest_infer_path(upstream_model: str, version: str | None = None) -> str:
    """REST-to-REST passthrough: the body is unchanged, only the path names the upstream model."""
    m = urllib.parse.quote(upstream_model, safe="")
    return f"/v2/models/{m}/versions/{urllib.parse.quote(version, safe='')}/infer" if version else f"/v2/models/{m}/infer"
