"""The shipped price table (prices.yaml beside this file): public list prices as data, read once,
turned into the config's per-1k fields for a `cost: {table: NAME}` entry."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import yaml

PRICE_TABLE = Path(__file__).resolve().with_name("prices.yaml")
# The table's keys and the `Cost` fields they fill (the table says per 1M tokens, the config per 1k).
_FIELDS = {"input": "input_per_1k", "output": "output_per_1k", "cached_input": "cached_input_per_1k",
           "cache_write": "cache_write_per_1k", "cache_write_1h": "cache_write_1h_per_1k"}


@functools.cache
def _table() -> dict[str, Any]:
    data = yaml.safe_load(PRICE_TABLE.read_text())
    models = data.get("models") if type(data) is dict else None
    if type(models) is not dict:
        raise ValueError(f"{PRICE_TABLE}: no models")
    return models


def table_models() -> list[str]:
    return sorted(_table())


def _per_1k(entry: dict[str, Any], where: str) -> dict[str, Any]:
    unknown = set(entry) - set(_FIELDS) - {"long_prompt", "above_prompt_tokens"}
    if unknown:
        raise ValueError(f"{where}: unknown price {sorted(unknown)[0]!r}")
    out: dict[str, Any] = {f: entry[k] / 1000 for k, f in _FIELDS.items() if k in entry}
    if "above_prompt_tokens" in entry:
        out["above_prompt_tokens"] = entry["above_prompt_tokens"]
    return out


def table_cost(name: str) -> dict[str, Any]:
    """The `Cost` fields of the table's entry `name`; ValueError naming the table when it has none."""
    entry = _table().get(name)
    if type(entry) is not dict:
        raise ValueError(f"cost.table: {name!r} is not in the shipped price table ({PRICE_TABLE.name}); it has "
                         + ", ".join(table_models()))
    out = _per_1k(entry, name)
    steps = entry.get("long_prompt") or []
    if steps:
        out["long_prompt"] = [_per_1k(s, f"{name}.long_prompt") for s in steps]
    return out
