"""The operator's console (docs/console.md): served by the extproc under `/console/` on the gateway's
listener, signed in with a `keys.admin_keys` key. The config model only; the pages are `console/`."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class ConsoleConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    # Off unless a config turns it on (the shipped modelyard.yaml does, for `make up`): a production
    # gateway exposes no web UI it did not ask for. It also needs `keys.admin_keys` to sign in.
    enabled: bool = False
    session_ttl_s: float = Field(default=8 * 3600.0, gt=0, le=7 * 86400.0)  # a sign-in lasts this long
