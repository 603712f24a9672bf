"""The Audit page, pure: which rows a search keeps (time, tenant, key, model, status, event) and the
table of them, newest first, with `modelyard audit verify`'s verdict above."""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from console.html import ROOT, Safe, field, join, notice, select, table, tag

EVENTS = ("", "call", "auth_failure", "key_admin", "config_reload", "limits_change", "prune")
SHOWN = 200  # the newest rows a search shows
DEFAULT_SINCE = "24h"  # a search names its window; the whole log is one click away (an empty since)


@dataclass(frozen=True, slots=True)
class Search:
    since: float | None = None
    until: float | None = None
    tenant: str = ""
    key: str = ""  # a prefix of the row's key_id (the key's hash prefix, or an admin key's)
    model: str = ""
    status: str = ""  # "429" or a class: "4xx"
    event: str = ""

    def keeps(self, row: Mapping[str, Any]) -> bool:
        t = float(row.get("time") or 0)
        if (self.since is not None and t < self.since) or (self.until is not None and t > self.until):
            return False
        if self.tenant and row.get("tenant") != self.tenant:
            return False
        if self.key and not str(row.get("key_id") or "").startswith(self.key):
            return False
        if self.model and row.get("model") != self.model:
            return False
        if self.event and row.get("event") != self.event:
            return False
        if self.status:
            status = str(row.get("status") or "")
            if self.status.endswith("xx"):
                return status[:1] == self.status[:1]
            return status == self.status
        return True


def newest(rows: Iterable[Mapping[str, Any]], search: Search, limit: int = SHOWN) -> tuple[list[Mapping[str, Any]], int]:
    """The newest `limit` rows the search keeps, newest first, and how many it kept in all."""
    kept: deque[Mapping[str, Any]] = deque(maxlen=limit)  # a long log streams through; only the newest stay
    matched = 0
    for r in rows:
        if search.keeps(r):
            kept.append(r)
            matched += 1
    return list(reversed(kept)), matched


def render(rows: Sequence[Mapping[str, Any]], matched: int, query: Mapping[str, str], *,
           verdict: tuple[bool, str] | None, error: str | None = None) -> Safe:
    form = tag("form", [
        field("since", "since", value=query.get("since", DEFAULT_SINCE), placeholder="24h or 2026-12-01"),
        field("until", "until", value=query.get("until", ""), placeholder="1h"),
        field("tenant", "tenant", value=query.get("tenant", "")),
        field("key id", "key", value=query.get("key", ""), placeholder="hash prefix"),
        field("model", "model", value=query.get("model", "")),
        field("status", "status", value=query.get("status", ""), placeholder="429 or 4xx"),
        select("event", "event", EVENTS, query.get("event", "")),
        Safe('<button type="submit">Search</button>'),
        Safe('<button type="submit" name="verify" value="1" class="secondary">Search and verify the chain</button>'),
    ], method="get", action=f"{ROOT}/audit", id="audit-search")
    parts = [notice(error, "bad")]
    if verdict is None:
        parts.append(tag("p", "modelyard audit verify walks the whole chain: ask for it with the second button.",
                         class_="empty", id="verdict-none"))
    else:
        parts.append(tag("p", ["modelyard audit verify: ", tag("strong", verdict[1], class_="ok" if verdict[0] else "bad")],
                           id="verdict", class_="notice" if verdict[0] else "notice bad"))
    body = [(r.get("time_iso", ""), r.get("event", ""), r.get("tenant", ""), tag("code", r.get("key_id") or ""),
             r.get("model") or "", r.get("status", ""), f"{r.get('method') or ''} {r.get('path') or ''}".strip(),
             r.get("detail") or "") for r in rows]
    parts += [form, tag("p", f"{matched:,} rows match; the newest {len(rows):,} shown.", id="audit-count"),
              table(["time", "event", "tenant", "key id", "model", "status", "request", "detail"], body, id_="audit",
                    empty="no audit rows match")]
    return join(parts)
