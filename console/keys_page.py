"""The Keys page, pure: the store's keys (their admin-API views) as a table with rotate and revoke,
the create form, and a new secret shown once (only in the answer to the create or rotate that made it)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from console.html import ROOT, Safe, field, form, join, notice, select, table, tag

PERIODS = ("month", "week", "day")


def create_body(form_fields: Mapping[str, str]) -> dict[str, Any]:
    """The create form as the admin API's JSON body (`keys.spec.spec_from_json` checks it): empty fields
    are left out, numbers stay text where they do not parse, so the spec's own messages name them."""
    body: dict[str, Any] = {}
    for name in ("tenant", "name", "expires", "budget_period"):
        v = form_fields.get(name, "").strip()
        if v:
            body[name] = v
    models = [m.strip() for m in form_fields.get("models", "").split(",") if m.strip()]
    if models:
        body["models"] = models
    for name, kind in (("budget_usd", float), ("rpm", int), ("tpm", int)):
        v = form_fields.get(name, "").strip()
        if v:
            try:
                body[name] = kind(v)
            except ValueError:
                body[name] = v
    if "budget_usd" not in body:
        body.pop("budget_period", None)
    return body


def update_body(form_fields: Mapping[str, str]) -> dict[str, Any]:
    """The narrow/budget form as the admin API's update body (`keys.spec.change_from_json` checks it)."""
    body = {k: v for k, v in create_body(form_fields).items() if k in ("models", "budget_usd", "budget_period")}
    if "budget_usd" in body:
        body["budget_period"] = form_fields.get("budget_period", "").strip() or "month"
    return body


def _change_form(k: Mapping[str, Any], token: str) -> Safe:
    kid = str(k.get("id", ""))
    models = ", ".join(k["models"]) if k.get("models") is not None else ""
    return tag("details", [tag("summary", "Narrow / budget"), form(f"{ROOT}/keys/{kid}/update", [
        field("models", "models", value=models, placeholder="within the key's models"),
        field("budget USD", "budget_usd", value="" if k.get("budget_usd") is None else k["budget_usd"], type_="number"),
        select("period", "budget_period", PERIODS, str(k.get("budget_period") or "month")),
    ], "Save", token, id_=f"update-{kid}")])


def render(keys: Sequence[Mapping[str, Any]], *, tenants: Sequence[str], models: Sequence[str],
           mint: Callable[[], str], shown: Mapping[str, Any] | None = None, message: str | None = None,
           error: str | None = None) -> Safe:
    parts: list[Safe] = [notice(message), notice(error, "bad")]
    if shown is not None:
        parts.append(tag("div", [
            tag("p", [f"The secret of {shown.get('id')} ", tag("strong", "is shown this once"),
                      ": copy it now, the gateway keeps only its hash."]),
            tag("code", shown.get("key", ""), id="new-secret", class_="secret"), " ",
            tag("button", "Copy", type="button", class_="secondary", data_copy="new-secret"),
        ], class_="notice", id="shown"))
    rows = []
    for k in keys:
        kid = str(k.get("id", ""))
        actions: list[Safe] = []
        if k.get("status") == "active":
            actions.append(form(f"{ROOT}/keys/{kid}/rotate", [], "Rotate", mint(),
                                confirm="A new secret; the old one stops working. Rotate?"))
            actions.append(form(f"{ROOT}/keys/{kid}/revoke", [], "Revoke", mint(),
                                confirm="The key stops working on every worker. Revoke?"))
            actions.append(_change_form(k, mint()))
        budget = "" if k.get("budget_usd") is None else f"${k['budget_usd']} / {k.get('budget_period')}"
        limits = " ".join(f"{u} {k[u]}" for u in ("rpm", "tpm") if k.get(u) is not None)
        rows.append([tag("code", kid), k.get("name") or "", k.get("tenant", ""),
                     ", ".join(k["models"]) if k.get("models") is not None else "all of the tenant's",
                     budget, limits, k.get("expires_at") or "", tag("span", k.get("status", ""),
                                                                    class_="ok" if k.get("status") == "active" else "bad"),
                     tag("code", k.get("hash_prefix", "")), join(actions)])
    parts.append(tag("h2", "Create a key"))
    parts.append(form(f"{ROOT}/keys", [
        select("tenant", "tenant", tenants),
        field("name", "name", placeholder="ci bot"),
        field("models (comma-separated; empty: all)", "models", placeholder=", ".join(models[:2])),
        field("budget USD", "budget_usd", type_="number", placeholder="50"),
        select("budget period", "budget_period", PERIODS),
        field("expires", "expires", placeholder="90d or 2027-01-01"),
        field("rpm", "rpm", type_="number"),
        field("tpm", "tpm", type_="number"),
    ], "Create", mint(), id_="create-key"))
    parts.append(tag("h2", f"Keys ({len(keys)})"))
    parts.append(table(["id", "name", "tenant", "models", "budget", "limits", "expires", "status", "key_id",
                        ""], rows, id_="keys", empty="no keys in the store yet"))
    return join(parts)

