"""Names of the control plane's HTTP API beyond contracts/live_config.py's core; the apply's token
and applied-by header moved there once the console (an extproc page) applied too. Re-exported here
for the control plane and `modelyard apply`."""

from __future__ import annotations

from contracts.live_config import APPLIED_BY_HEADER, TOKEN_ENV

__all__ = ["APPLIED_BY_HEADER", "TOKEN_ENV"]
