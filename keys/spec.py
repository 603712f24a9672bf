"""What a new key asks for, checked against the config: the CLI and the admin API share it.

Pure: parsing and validation only; a bad field raises `KeySpecError` naming it.
"""

from __future__ import annotations

import math
import re
import time
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from contracts.config import GatewayConfig
from contracts.config.ratelimit import MAX_BURST

PERIODS = ("day", "week", "month")
_RELATIVE = re.compile(r"^(\d+(?:\.\d+)?)([smhd])$")
_UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86400}
_FIELDS = {"tenant", "name", "models", "budget_usd", "budget_period", "expires", "rpm", "tpm"}


class KeySpecError(ValueError):
    """A create request that cannot be honoured; the message names the field."""


@dataclass(frozen=True, slots=True)
class KeySpec:
    tenant: str
    name: str = ""
    models: tuple[str, ...] | None = None
    expires_at: float | None = None
    budget_usd: float | None = None
    budget_period: str | None = None
    rpm: int | None = None  # the key's own requests per minute
    tpm: int | None = None  # the key's own tokens per minute


def parse_expiry(text: str, now: float | None = None) -> float:
    """`2027-01-01T00:00:00Z` (no zone: UTC) or a span from now: `30d`, `12h`, `15m`, `90s`."""
    now = time.time() if now is None else now
    text = text.strip()
    m = _RELATIVE.match(text)
    if m:
        span = float(m[1]) * _UNIT_S[m[2]]
        if span <= 0:
            raise KeySpecError(f"expires: {text!r} is not in the future")
        return now + span
    try:
        when = datetime.fromisoformat(text)
    except ValueError:
        raise KeySpecError(f"expires: {text!r} is neither an ISO 8601 time (2027-01-01T00:00:00Z) "
                           "nor a span (30d, 12h, 15m, 90s)") from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    at = when.timestamp()
    if at <= now:
        raise KeySpecError(f"expires: {text!r} is in the past")
    return at


def per_minute(field: str, value: Any) -> int | None:
    """A per-minute limit: a whole number from 1 to the largest bucket (a JSON integer or its digits)."""
    if value is None:
        return None
    if isinstance(value, str) and value.strip().isdigit():
        value = int(value.strip())
    if isinstance(value, bool) or not isinstance(value, int):
        raise KeySpecError(f"{field}: expected a whole number per minute, got {value!r}")
    if not 1 <= value <= MAX_BURST:
        raise KeySpecError(f"{field}: must be from 1 to {MAX_BURST} per minute, got {value}")
    return value


def build_spec(config: GatewayConfig, *, tenant: Any, name: Any = "", models: Any = None, budget_usd: Any = None,
               budget_period: Any = None, expires: Any = None, rpm: Any = None, tpm: Any = None,
               now: float | None = None) -> KeySpec:
    """A checked spec: the tenant exists in the config, the models are configured models, the budget
    is a finite amount >= 0 with a known period, the expiry is well-formed and in the future, the
    per-minute limits are whole numbers from 1 to the largest bucket (4,500,000)."""
    if not isinstance(tenant, str) or not tenant:
        raise KeySpecError("tenant: required (a tenant name from the config)")
    known = [t.name for t in config.tenants]
    if tenant not in known:
        raise KeySpecError(f"tenant: unknown tenant {tenant!r} (configured: {', '.join(known)})")
    if not isinstance(name, str) or len(name) > 200:
        raise KeySpecError("name: expected a string of at most 200 characters")
    narrowed: tuple[str, ...] | None = None
    if models is not None:
        if isinstance(models, str):
            models = [m.strip() for m in models.split(",") if m.strip()]
        if not isinstance(models, list) or not models or not all(isinstance(m, str) and m for m in models):
            raise KeySpecError("models: expected a non-empty list of model names")
        names = {m.name for m in config.models} | {g for m in config.models for g in m.groups}
        unknown = [m for m in models if m not in names]
        if unknown:
            raise KeySpecError(f"models: unknown model {unknown[0]!r}")
        narrowed = tuple(dict.fromkeys(models))
    usd: float | None = None
    period: str | None = None
    if budget_usd is not None:
        if isinstance(budget_usd, bool):
            raise KeySpecError("budget_usd: expected a number")
        try:
            usd = float(budget_usd)
        except (TypeError, ValueError):
            raise KeySpecError(f"budget_usd: {budget_usd!r} is not a number") from None
        if not math.isfinite(usd) or usd < 0:
            raise KeySpecError(f"budget_usd: must be a finite amount of 0 or more, got {budget_usd!r}")
        period = budget_period or "month"
    if budget_period is not None:
        if budget_period not in PERIODS:
            raise KeySpecError(f"budget_period: {budget_period!r} is not one of {', '.join(PERIODS)}")
        if usd is None:
            raise KeySpecError("budget_period: needs budget_usd")
    expires_at: float | None = None
    if expires is not None:
        if not isinstance(expires, str):
            raise KeySpecError("expires: expected a string (2027-01-01T00:00:00Z or 30d)")
        expires_at = parse_expiry(expires, now)
    return KeySpec(tenant=tenant, name=name, models=narrowed, expires_at=expires_at, budget_usd=usd,
                   budget_period=period, rpm=per_minute("rpm", rpm), tpm=per_minute("tpm", tpm))


def spec_from_json(config: GatewayConfig, body: Mapping[str, Any]) -> KeySpec:
    """The admin API's create body: the same fields as the CLI's flags."""
    extra = sorted(set(body) - _FIELDS)
    if extra:
        raise KeySpecError(f"{extra[0]}: unknown field (known: {', '.join(sorted(_FIELDS))})")
    return build_spec(config, tenant=body.get("tenant"), name=body.get("name") or "", models=body.get("models"),
                      budget_usd=body.get("budget_usd"), budget_period=body.get("budget_period"),
                      expires=body.get("expires"), rpm=body.get("rpm"), tpm=body.get("tpm"))


@dataclass(frozen=True, slots=True)
class KeyChange:
    """A change to a live key (`modelyard keys update`, the admin API's update, the console): narrow its
    models, set its budget. None leaves a field as it is; the secret, tenant and limits stay."""

    models: tuple[str, ...] | None = None
    budget_usd: float | None = None
    budget_period: str | None = None


_CHANGE_FIELDS = {"models", "budget_usd", "budget_period"}


def build_change(config: GatewayConfig, tenant: str, *, models: Any = None, budget_usd: Any = None,
                 budget_period: Any = None) -> KeyChange:
    """A checked change, with create's checks (known models, a finite budget, a known period)."""
    if models is None and budget_usd is None and budget_period is None:
        raise KeySpecError("nothing to change: give models, budget_usd or budget_period")
    spec = build_spec(config, tenant=tenant, models=models, budget_usd=budget_usd, budget_period=budget_period)
    return KeyChange(models=spec.models, budget_usd=spec.budget_usd, budget_period=spec.budget_period)


def change_from_json(config: GatewayConfig, tenant: str, body: Mapping[str, Any]) -> KeyChange:
    """The admin API's update body: the same fields as the CLI's flags."""
    extra = sorted(set(body) - _CHANGE_FIELDS)
    if extra:
        raise KeySpecError(f"{extra[0]}: cannot change on a key (changeable: {', '.join(sorted(_CHANGE_FIELDS))}; "
                           "create a new key for anything else)")
    return build_change(config, tenant, models=body.get("models"), budget_usd=body.get("budget_usd"),
                        budget_period=body.get("budget_period"))


def narrowing(current: tuple[str, ...] | None, wanted: tuple[str, ...]) -> None:
    """A key's models only narrow: a key that names models may not gain one (a new key may)."""
    if current is None:
        return
    wider = [m for m in wanted if m not in current]
    if wider:
        raise KeySpecError(f"models: {wider[0]!r} is not among the key's models ({', '.join(current)}): a key only "
                           "narrows; create a new key to widen")
