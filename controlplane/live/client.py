"""`modelyard apply` and `modelyard status`: the control plane's HTTP API from the command line."""

from __future__ import annotations

import getpass
import json
import os
import socket
import sys
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from contracts.config import config_path
from contracts.errors import ConfigError
from contracts.live_config import APPLY_PATH, STATUS_PATH
from controlplane.live.config_text import parse_text
from controlplane.live.wire import APPLIED_BY_HEADER, TOKEN_ENV


def _url(api_address: str, path: str) -> str:
    return api_address.rstrip("/") + path if "://" in api_address else f"http://{api_address}{path}"


def _call(url: str, data: bytes | None, timeout: float) -> tuple[int, dict[str, Any]]:
    headers = {}
    if data is not None:
        headers = {"content-type": "application/yaml", APPLIED_BY_HEADER: f"{getpass.getuser()}@{socket.gethostname()}"}
        if token := os.environ.get(TOKEN_ENV):
            headers["authorization"] = f"Bearer {token}"
    req = urllib.request.Request(url, data=data, method="POST" if data is not None else "GET", headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, json.loads(r.read() or b"{}")
    except urllib.error.HTTPError as e:
        body = e.read()
        try:
            return e.code, json.loads(body)
        except ValueError:
            return e.code, {"error": body.decode("utf-8", "replace")[:500]}


def apply(file: str | None, *, url: str | None = None, timeout: float = 60.0) -> int:
    """Validate FILE here, then POST it; 0 once Envoy and every extproc run it, else 1 and why."""
    path = config_path(file)
    try:
        text = Path(path).read_bytes()
    except OSError as e:
        print(f"modelyard apply: {path}: cannot read ({e.strerror})", file=sys.stderr)
        return 1
    try:
        cfg = parse_text(text, str(path))
    except ConfigError as e:
        print(f"modelyard apply: refused, nothing changed: {e}", file=sys.stderr)
        return 1
    target = _url(url or cfg.controlplane.api_address, APPLY_PATH)
    try:
        status, body = _call(target, text, timeout)
    except (urllib.error.URLError, OSError) as e:
        print(f"modelyard apply: no control plane at {target} ({getattr(e, 'reason', e)})", file=sys.stderr)
        return 1
    if status == 200:
        print(f"applied {path}: version {body['version']}" + (" (already running)" if body.get("unchanged") else ""))
        return 0
    what = "refused, nothing changed" if status == 400 else f"failed ({status})"
    print(f"modelyard apply: {what}: {body.get('error', body)}", file=sys.stderr)
    return 1


def status(file: str | None, *, url: str | None = None, as_json: bool = False, timeout: float = 10.0) -> int:
    """The running version and who has it; 0 when Envoy and every worker run it, 1 otherwise."""
    if url is None:
        try:
            url = parse_text(Path(config_path(file)).read_bytes(), str(config_path(file))).controlplane.api_address
        except OSError as e:
            print(f"modelyard status: {config_path(file)}: cannot read ({e.strerror})", file=sys.stderr)
            return 1
    target = _url(url, STATUS_PATH)
    try:
        code, st = _call(target, None, timeout)
    except (urllib.error.URLError, OSError) as e:
        print(f"modelyard status: no control plane at {target} ({getattr(e, 'reason', e)})", file=sys.stderr)
        return 1
    if code != 200:
        print(f"modelyard status: {target} answered {code}: {st}", file=sys.stderr)
        return 1
    if as_json:
        print(json.dumps(st, indent=2))
    else:
        print(format_status(st))
    version = st["version"]
    in_sync = all(s["version"] == version for s in st["envoy"]["streams"]) and \
        all(w["version"] == version for w in st["workers"])
    return 0 if in_sync else 1


def format_status(st: dict[str, Any]) -> str:
    lines = [f"version {st['version']} (applied by {st.get('applied_by', '?')})"]
    envoy = st["envoy"]
    for s in envoy["streams"]:
        lines.append(f"  envoy {s['node'] or '?'} ({s['peer']}): {s['version'] or 'not yet'}")
    if not envoy["streams"]:
        lines.append("  envoy: none connected")
    if envoy["nack"]:
        n = envoy["nack"]
        lines.append(f"  envoy refused version {n['version']} ({n['type']}, {n['node']}): {n['error']}")
    for w in st["workers"]:
        lines.append(f"  worker {w['worker']}: {w['version'] or '?'}" + (f" (refused: {w['error']})" if w["error"] else ""))
    if not st["workers"]:
        lines.append("  workers: none subscribed")
    return "\n".join(lines)
