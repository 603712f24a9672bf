"""The Limits page, pure: every bucket this worker has charged at its level now with its recent
refusals (`modelyard ratelimit status`), and the tuner's rate/burst frontier and what-if for a key
(`modelyard ratelimit tune`), drawn as inline SVG."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from console.html import ROOT, Safe, field, join, line_chart, notice, select, table, tag

KEYS = ("tenant", "tier", "cluster", "channel", "model", "key")


def render(status: Mapping[str, Any] | None, tuned: Mapping[str, Any] | None,
           frontiers: Mapping[str, Sequence[tuple[float, float]]], query: Mapping[str, str], *,
           error: str | None = None, tune_error: str | None = None) -> Safe:
    parts: list[Safe] = [notice(error, "bad")]
    if status is not None:
        head = (f"backend {status.get('backend')}{' (DEGRADED: Redis down)' if status.get('degraded') else ''}; "
                f"{len(status.get('buckets', []))} buckets; {status.get('refusals', 0)} refusals in the last "
                f"{status.get('window_s', 60):g} s" + ("" if status.get("enabled", True) else "; rate limiting is off"))
        rows = []
        for b in status.get("buckets", []):
            burst = float(b.get("burst") or 0) or 1.0
            level = max(0.0, float(b.get("level") or 0))
            last = b.get("last_refusal_s_ago")
            rows.append((tag("code", b.get("key", "")), b.get("unit", ""), f"{b.get('rate', 0):g}/s",
                         f"{b.get('burst', 0):g}", f"{level:.3f}".rstrip("0").rstrip("."),
                         Safe(f'<meter min="0" max="1" value="{min(1.0, level / burst):.3f}"></meter> ')
                         + tag("span", f"{level / burst:.0%}"),
                         tag("span", b.get("refusals", 0), class_="bad" if b.get("refusals") else ""),
                         "-" if last is None else f"{last:.1f} s ago"))
        parts += [tag("p", head, id="limits-head"),
                  table(["bucket", "unit", "rate", "burst", "level", "full", "refusals", "last refusal"], rows,
                        id_="buckets", empty="no bucket charged yet on this worker")]
    parts.append(tag("h2", "Tune: the rate/burst frontier and what-if (ratelimit tune)"))
    parts.append(tag("form", [
        select("one bucket per", "key", KEYS, query.get("key", "tenant")),
        select("unit", "unit", ("requests", "tokens"), query.get("unit", "requests")),
        field("since", "since", value=query.get("since", "7d")),
        field("target refused share", "target", value=query.get("target", "0.01")),
        Safe('<button type="submit" name="tune" value="1">Replay</button>'),
    ], method="get", action=f"{ROOT}/limits", id="tune-form"))
    parts.append(notice(tune_error, "bad"))
    if tuned is not None:
        tuned_rows: list[tuple[object, ...]] = []
        for k in tuned.get("keys", []):
            tuned_rows.append((k.get("key", ""), k.get("requests", 0), f"{k.get('peak_1s', 0):g}",
                         _n(k.get("live_rejected")), _n(k.get("current_rejected")),
                         "-" if k.get("rate") is None else f"{k['rate']:g}/s", _n(k.get("burst")),
                         _n(k.get("rejected")), k.get("how", "")))
        parts.append(table(["key", "requests", "peak in 1 s", "refused live", "refused by the current limits (what-if)",
                            "recommended rate", "burst", "would refuse", "why this point"], tuned_rows, id_="tune",
                           empty="no traffic in this window"))
        for note in tuned.get("notes", []):
            parts.append(tag("p", note, class_="empty"))
        picks = {k.get("key"): (k.get("rate"), k.get("burst")) for k in tuned.get("keys", [])}
        for key, points in list(frontiers.items())[:4]:
            rate, burst = picks.get(key, (None, None))
            marks = [(float(rate), float(burst), f"pick {rate:g}/s, {burst}")] if rate is not None and burst is not None \
                else []
            parts.append(tag("h2", f"Frontier: {key}"))
            parts.append(line_chart(points, x_label=f"rate ({tuned.get('unit')}/s)", y_label="smallest burst",
                                    marks=marks, id_=f"frontier-{len(parts)}"))
    return join(parts)


def _n(v: object) -> str:
    return "-" if v is None else str(v)
