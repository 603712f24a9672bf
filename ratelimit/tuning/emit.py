"""The recommendation as a `ratelimit:` section the config loader accepts as is, and its diff
against the current one. Only the tuned scope and unit change: one exact rule per key value
(the global rule for `--key global`); every other rule and setting is kept."""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from typing import Any

import yaml

from contracts.config.ratelimit import SCOPES, RateLimitConfig, Unit, parse_config

from .frontier import Point


def read_section(path: str) -> dict[str, Any]:
    """The `ratelimit:` mapping of a modelyard.yaml, and nothing else of it."""
    with open(path) as f:
        raw = yaml.safe_load(f) or {}
    if not isinstance(raw, dict):
        raise ValueError(f"{path}: expected a mapping at the top")
    section = raw.get("ratelimit") or {}
    if not isinstance(section, dict):
        raise ValueError(f"{path}: ratelimit: expected a mapping")
    return section


def _rule(scope: str, value: str, unit: Unit, p: Point) -> dict[str, Any]:
    r: dict[str, Any] = {"scope": scope}
    if scope != "global":
        r["match"] = value
    r.update(unit=unit, rate=p.rate, burst=p.burst)
    return r


def recommended_section(current: Mapping[str, Any], key: str, unit: Unit,
                        picks: Mapping[str, Point]) -> dict[str, Any]:
    """`current` with the rules for (key, unit) of every picked value replaced or added."""
    if key not in SCOPES:
        raise ValueError(f"{key!r} is not a limiter scope ({', '.join(SCOPES)}); no rule can limit it")
    cfg = parse_config(dict(current))  # the current section must itself be valid
    chosen = {v: p for v, p in picks.items() if p.burst is not None}
    kept = []
    for raw, r in zip(current.get("limits") or [], cfg.limits):
        replaced = r.scope == key and r.unit == unit and r.tier is None and (
            r.match in chosen or (key == "global" and bool(chosen)))
        if not replaced:
            kept.append(raw)  # as the operator wrote it
    new = [_rule(key, v, unit, chosen[v]) for v in sorted(chosen)]
    out = dict(current)
    out["limits"] = kept + new
    parse_config(out)  # what we write, the loader takes
    return out


def as_config(section: Mapping[str, Any]) -> RateLimitConfig:
    return parse_config(dict(section))


def render(section: Mapping[str, Any]) -> str:
    limits = section.get("limits", [])
    rest = {k: v for k, v in section.items() if k != "limits"}
    text = "ratelimit:\n"
    if rest:
        text += "".join("  " + ln + "\n" for ln in yaml.safe_dump(rest, sort_keys=False).splitlines())
    text += "  limits:\n"
    for r in limits:
        text += "    - " + yaml.safe_dump(dict(r), default_flow_style=True, sort_keys=False, width=1000).strip() + "\n"
    return text


def diff(current: Mapping[str, Any], new: Mapping[str, Any], current_name: str = "current") -> str:
    a, b = render(current).splitlines(keepends=True), render(new).splitlines(keepends=True)
    return "".join(difflib.unified_diff(a, b, f"{current_name} (ratelimit:)", "recommended (ratelimit:)"))
