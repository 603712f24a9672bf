"""Live config wire contract between the control plane and the extprocs (HTTP + JSON).

An extproc long-polls `GET CONFIG_PATH?have=<version>&worker=<id>`; the control plane answers as soon
as its version differs from `have` (200, `{"version", "yaml"}`), else 304 after WAIT_S. The extproc
applies the text atomically and reports `POST ACK_PATH` `{"worker", "version", "ok", "error"}`.
`modelyard apply` POSTs the file's text to APPLY_PATH: 200 `{"version"}` once Envoy and every
subscribed worker have it, 400 `{"error"}` when it does not validate (nothing changes), 504 when
someone did not confirm in time. STATUS_PATH answers the running version and who has it.
"""

from __future__ import annotations

import hashlib

CONFIG_PATH = "/v1/config"
ACK_PATH = "/v1/config/ack"
APPLY_PATH = "/v1/apply"
STATUS_PATH = "/v1/status"
# The running text, the one before it and the recent applies (the console's Config page: its diff and history).
TEXT_PATH = "/v1/config/text"
# Set in the control plane's environment: an apply must carry it as a bearer token (`modelyard apply` and
# the console send it from theirs).
TOKEN_ENV = "MODELYARD_CONTROLPLANE_TOKEN"
# Who applied a config (the CLI sends user@host, the console console:<admin key id>@<client>): the log,
# /v1/status, and the long poll's answer.
APPLIED_BY_HEADER = "x-modelyard-applied-by"
WAIT_S = 25.0
VERSION_HEADER = "x-modelyard-config-version"


def config_version(text: bytes) -> str:
    """The running version: a content hash, so the same file applied twice is the same version."""
    return hashlib.sha256(text).hexdigest()[:16]
