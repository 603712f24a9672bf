"""The Config page, pure: the version each Envoy and worker runs (the control plane's status), who
applied what and when, the last change as a diff, and the apply form (validated before anything moves)."""

from __future__ import annotations

import difflib
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from console.html import ROOT, Safe, esc, form, join, notice, table, tag, textarea


def when(ts: object) -> str:
    try:
        return datetime.fromtimestamp(float(str(ts)), UTC).isoformat(timespec="seconds").replace("+00:00", "Z")
    except (TypeError, ValueError):
        return ""


def diff(old: str, new: str, old_name: str, new_name: str) -> Safe:
    """A unified diff, lines coloured by kind; every line escaped."""
    lines = list(difflib.unified_diff(old.splitlines(), new.splitlines(), old_name, new_name, lineterm="", n=2))
    if not lines:
        return tag("p", "no change", class_="empty")
    out = []
    for line in lines:
        kind = "add" if line.startswith("+") and not line.startswith("+++") else \
            "del" if line.startswith("-") and not line.startswith("---") else ""
        out.append(Safe(f'<span class="{kind}">{esc(line)}</span>') if kind else esc(line))
    return Safe(f'<pre id="diff">{Safe(chr(10).join(out))}</pre>')


def in_sync(status: Mapping[str, Any]) -> bool:
    version = status.get("version")
    envoy = status.get("envoy", {}).get("streams", [])
    return all(s.get("version") == version for s in envoy) and \
        all(w.get("version") == version for w in status.get("workers", []))


def render(status: Mapping[str, Any] | None, text: Mapping[str, Any] | None, *, mint: Callable[[], str],
           draft: str | None = None, message: str | None = None, error: str | None = None,
           unavailable: str | None = None) -> Safe:
    parts: list[Safe] = [notice(message), notice(error, "bad"), notice(unavailable, "bad")]
    if status is not None:
        version = status.get("version", "")
        parts.append(tag("p", ["Running version ", tag("code", version, id="running-version"), " applied by ",
                               tag("strong", status.get("applied_by", "?")), f" at {when(status.get('applied_at'))}; ",
                               tag("span", "every Envoy and worker runs it" if in_sync(status) else "not everyone runs it yet",
                                   class_="ok" if in_sync(status) else "bad", id="sync")]))
        rows: list[Sequence[object]] = []
        for s in status.get("envoy", {}).get("streams", []):
            rows.append(("envoy", s.get("node") or "?", s.get("peer", ""), tag("code", s.get("version") or "not yet"), ""))
        for w in status.get("workers", []):
            rows.append(("worker", w.get("worker", ""), f"seen {w.get('seen_s_ago', '?')} s ago",
                         tag("code", w.get("version") or "?"), w.get("error") or ""))
        parts.append(table(["who", "id", "", "version", "refused"], rows, id_="versions", empty="nobody connected"))
        nack = status.get("envoy", {}).get("nack")
        if nack:
            parts.append(notice(f"Envoy refused version {nack.get('version')}: {nack.get('error')}", "bad"))
    if text is not None:
        history = [(when(h.get("at")), h.get("applied_by", ""), tag("code", h.get("version", "")), h.get("status", ""),
                    h.get("error") or "") for h in reversed(text.get("history", []))]
        parts.append(tag("h2", "Applies"))
        parts.append(table(["when", "who", "version", "result", "error"], history, id_="history",
                           empty="nothing applied since the control plane started"))
        prev = text.get("previous")
        parts.append(tag("h2", "The last change"))
        if prev:
            parts.append(diff(prev.get("yaml", ""), text.get("yaml", ""), f"version {prev.get('version')}",
                              f"version {text.get('version')}"))
        else:
            parts.append(tag("p", "the running config is the one the control plane started with", class_="empty"))
        parts.append(tag("h2", "Apply"))
        parts.append(tag("p", "Checked here first, then by the control plane; nothing changes unless both accept it. "
                              "The page answers once Envoy and every worker run it (as `modelyard apply`).",
                         class_="empty"))
        parts.append(form(f"{ROOT}/config", [textarea("modelyard.yaml", "yaml", draft if draft is not None
                                                      else str(text.get("yaml", "")), rows=24)],
                          "Validate and apply", mint(), id_="apply"))
    return join(parts)
