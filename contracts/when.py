"""The times an operator names: `7d`, `12h`, `30m`, `90s`, `2w` (that long ago) or an ISO date/time.

One format for every `--since`/`--until` (`modelyard spend`, `audit export`, `ratelimit tune`) and
the admin API's `?since=`: a caller learns it once.
"""

from __future__ import annotations

import re
import time
from datetime import UTC, datetime

_DURATION = re.compile(r"^(\d+(?:\.\d+)?)\s*([smhdw])$")
_UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


def parse_when(text: str, now: float | None = None) -> float:
    """`7d`, `12h`, `30m`, `90s`, `2w` (that long ago) or an ISO date/time (UTC unless it says
    otherwise) as epoch seconds; ValueError for anything else."""
    now = time.time() if now is None else now
    m = _DURATION.match(text.strip())
    if m:
        return now - float(m[1]) * _UNIT_S[m[2]]
    dt = datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=UTC)
    return dt.timestamp()
