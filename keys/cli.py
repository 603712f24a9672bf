"""`modelyard keys create|list|rotate|revoke`: the store, straight from the operator's shell.

Bad input is one line on stderr and exit 2 (unknown tenant, negative budget, malformed expiry);
an unknown id or an unreachable store is exit 1. The secret is printed once, at create or rotate.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from typing import Any

from contracts.config import config_path, load_config
from contracts.errors import ConfigError
from keys.db import StoreError, connect, redacted
from keys.location import store_dsn
from keys.record import KeyRecord
from keys.spec import PERIODS, KeySpecError, build_change, build_spec
from keys.store import KeyStore, RevokedKey, UnknownKey


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="modelyard keys", description="virtual keys in the key store (docs/keys.md)")
    sub = p.add_subparsers(dest="cmd", required=True)

    def common(sp: argparse.ArgumentParser) -> argparse.ArgumentParser:
        sp.add_argument("--config", "-c", default=None, help="modelyard.yaml (default: $MODELYARD_CONFIG or ./modelyard.yaml)")
        sp.add_argument("--store", default=None, help="a DSN instead of the config's keys.store")
        sp.add_argument("--json", action="store_true", help="print JSON")
        return sp

    c = common(sub.add_parser("create", help="a new key for a tenant; its secret is printed once"))
    c.add_argument("--tenant", required=True)
    c.add_argument("--name", default="", help="a label for people (who or what holds the key)")
    c.add_argument("--models", default=None, help="comma-separated models the key may use (within the tenant's)")
    c.add_argument("--budget-usd", default=None, help="the key's spend cap per period")
    c.add_argument("--budget-period", default=None, help=f"one of {', '.join(PERIODS)} (default month)")
    c.add_argument("--expires", default=None, help="2027-01-01T00:00:00Z (UTC when no zone) or a span: 30d, 12h, 15m")
    c.add_argument("--rpm", default=None, help="the key's own requests per minute (beside its tenant's limits)")
    c.add_argument("--tpm", default=None, help="the key's own tokens per minute (estimated, then reconciled with usage)")
    ls = common(sub.add_parser("list", help="every key (no secrets)"))
    ls.add_argument("--tenant", default=None)
    u = common(sub.add_parser("update", help="narrow a key's models, set its budget (the secret stays)"))
    u.add_argument("id")
    u.add_argument("--models", default=None, help="comma-separated: within the key's own models")
    u.add_argument("--budget-usd", default=None, help="the key's new spend cap per period")
    u.add_argument("--budget-period", default=None, help=f"one of {', '.join(PERIODS)} (default month)")
    for name, what in (("rotate", "a new secret for the key; the old one stops working"),
                       ("revoke", "the key stops working")):
        sp = common(sub.add_parser(name, help=what))
        sp.add_argument("id")
    return p


def _row(rec: KeyRecord) -> str:
    v = rec.view()
    models = ",".join(v["models"]) if v["models"] is not None else "*"
    budget = f"{v['budget_usd']:g}/{v['budget_period']}" if v["budget_usd"] is not None else "-"
    limits = " ".join(f"{v[u]}{u}" for u in ("rpm", "tpm") if v[u] is not None) or "-"
    return (f"{v['id']:<22} {v['tenant']:<16} {v['status']:<8} {models:<28} {v['expires_at'] or '-':<21} "
            f"{budget:<14} {limits:<20} {v['hash_prefix']}  {v['name']}")


def _print_secret(rec: KeyRecord, secret: str, as_json: bool) -> None:
    if as_json:
        print(json.dumps({"id": rec.id, "key": secret}))
        return
    print(f"id:     {rec.id}\ntenant: {rec.tenant}\nkey:    {secret}")
    print("Store the key now: it is not shown again (only its sha256 is kept).", file=sys.stderr)


def run(a: argparse.Namespace) -> int:
    config = load_config(a.config)
    dsn = a.store or store_dsn(config, config_path(a.config))
    if a.cmd == "create":
        spec = build_spec(config, tenant=a.tenant, name=a.name, models=a.models, budget_usd=a.budget_usd,
                          budget_period=a.budget_period, expires=a.expires, rpm=a.rpm, tpm=a.tpm)
    store = KeyStore(connect(dsn))
    try:
        out: Any
        if a.cmd == "create":
            rec, secret = store.create(spec)
            _print_secret(rec, secret, a.json)
        elif a.cmd == "rotate":
            rec, secret = store.rotate(a.id)
            _print_secret(rec, secret, a.json)
        elif a.cmd == "update":
            change = build_change(config, store.get(a.id).tenant, models=a.models, budget_usd=a.budget_usd,
                                  budget_period=a.budget_period)
            rec = store.update(a.id, change)
            print(json.dumps(rec.view()) if a.json else f"updated {rec.id}\n{_row(rec)}")
        elif a.cmd == "revoke":
            rec = store.revoke(a.id)
            print(json.dumps(rec.view()) if a.json else f"revoked {rec.id} (tenant {rec.tenant})")
        else:
            recs = store.list(a.tenant)
            if a.json:
                out = [r.view() for r in recs]
                print(json.dumps(out))
            else:
                print(f"{'ID':<22} {'TENANT':<16} {'STATUS':<8} {'MODELS':<28} {'EXPIRES':<21} {'BUDGET':<14} "
                      f"{'LIMITS':<20} HASH          NAME")
                for r in recs:
                    print(_row(r))
        return 0
    finally:
        store.close()


def main(argv: Sequence[str]) -> int:
    a = _parser().parse_args(list(argv))
    try:
        return run(a)
    except KeySpecError as e:
        print(f"modelyard keys {a.cmd}: {e}", file=sys.stderr)
        return 2
    except ConfigError as e:
        print(f"modelyard keys: configuration error: {e}", file=sys.stderr)
        return 2
    except (UnknownKey, RevokedKey) as e:
        print(f"modelyard keys {a.cmd}: {e.args[0]}", file=sys.stderr)
        return 1
    except StoreError as e:
        print(f"modelyard keys {a.cmd}: {redacted(str(e))}", file=sys.stderr)
        return 1
