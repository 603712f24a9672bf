"""Prices as invoiced (issue 39): uncached input, cached reads, 5-minute and 1-hour cache writes and
output each at their own price, long-prompt steps, and the shipped price table behind `cost.table`."""

from __future__ import annotations

import math

import pytest
import yaml

from budgets.pricing import charge, search_cost
from contracts.config import DEFAULT_CONFIG, Cost, parse_config
from contracts.config.prices import PRICE_TABLE, table_models
from contracts.errors import ConfigError

SONNET = Cost(table="claude-sonnet-4-5")  # $3 in, $15 out, $0.30 read, $3.75 / $6 writes per 1M
GPT = Cost(table="gpt-4o")  # $2.50 in, $10 out, $1.25 cached, no write price
PLAIN = Cost(input_per_1k=1.0, output_per_1k=2.0)

CASES = [
    # (name, price, (input, output, read, write, write_1h), cost in USD, saved in USD)
    ("no cache", SONNET, (1000, 100, 0, 0, 0), (1000 * 3 + 100 * 15) / 1e6, 0.0),
    ("anthropic read and both writes", SONNET, (2006, 300, 1920, 80, 50),
     (6 * 3 + 1920 * 0.30 + 30 * 3.75 + 50 * 6 + 300 * 15) / 1e6, (2006 * 3 - (6 * 3 + 1920 * 0.30 + 30 * 3.75 + 50 * 6)) / 1e6),
    ("writes cost more than they save", SONNET, (1000, 0, 0, 1000, 0), 1000 * 3.75 / 1e6, -1000 * 0.75 / 1e6),
    ("openai read", GPT, (2006, 300, 1920, 0, 0), (86 * 2.5 + 1920 * 1.25 + 300 * 10) / 1e6, 1920 * 1.25 / 1e6),
    ("no cached price: input price", PLAIN, (2006, 300, 1920, 80, 0), (2006 * 1.0 + 300 * 2.0) / 1e3, 0.0),
    ("long prompt steps up", SONNET, (300_000, 10, 100_000, 0, 0),
     (200_000 * 6 + 100_000 * 0.60 + 10 * 22.5) / 1e6, 100_000 * (6 - 0.60) / 1e6),
    ("exactly at the step: base price", SONNET, (200_000, 0, 0, 0, 0), 200_000 * 3 / 1e6, 0.0),
]


@pytest.mark.parametrize(("name", "price", "tokens", "cost", "saved"), CASES, ids=[c[0] for c in CASES])
def test_charge(name: str, price: Cost, tokens: tuple[int, int, int, int, int], cost: float, saved: float) -> None:
    got = charge(price, *tokens)
    assert math.isclose(got.cost, cost, rel_tol=1e-9, abs_tol=1e-15)
    assert math.isclose(got.saved, saved, rel_tol=1e-9, abs_tol=1e-15)


def test_the_shipped_table_names_its_source_and_date_and_reads_whole() -> None:
    data = yaml.safe_load(PRICE_TABLE.read_text())
    assert data["as_of"] and set(data["source"]) == {"anthropic", "openai", "gemini"}
    assert data["unit"] == "usd_per_1m_tokens"
    for name in table_models():
        c = Cost(table=name)
        assert c.input_per_1k > 0 and c.output_per_1k > 0 and c.cached_input_per_1k is not None, name
        assert c.cached_input_per_1k < c.input_per_1k, name


def _config(model_cost: dict, deployment_cost: dict | None = None) -> dict:
    """The repository's modelyard.yaml with its first model's (and first deployment's) prices replaced."""
    data = yaml.safe_load(DEFAULT_CONFIG.read_text())
    model = data["models"][0]
    model["cost"] = model_cost
    if deployment_cost is not None:
        model["deployments"][0]["cost"] = deployment_cost
    return data


def test_a_model_takes_a_table_entry_and_overrides_a_price_and_a_deployment_its_own() -> None:
    cfg = parse_config(_config({"table": "claude-sonnet-4-5", "cached_input_per_1k": 0.0001},
                               {"table": "claude-haiku-4-5"}), "test")
    model = cfg.models[0]
    assert (model.cost.input_per_1k, model.cost.cached_input_per_1k, model.cost.cache_write_1h_per_1k) == \
        (0.003, 0.0001, 0.006)
    assert model.deployments[0].cost is not None and model.deployments[0].cost.input_per_1k == 0.001


def test_an_unknown_table_entry_is_refused_at_load() -> None:
    with pytest.raises(ConfigError, match=r"models\[0\]\.cost: .*'claude-9' is not in the shipped price table"):
        parse_config(_config({"table": "claude-9"}), "test")


def test_long_prompt_steps_must_go_up() -> None:
    with pytest.raises(ConfigError, match="steps must go up"):
        parse_config(_config({"input_per_1k": 1, "long_prompt": [{"above_prompt_tokens": 200},
                                                                 {"above_prompt_tokens": 100}]}), "test")


def test_web_searches_bill_per_search_and_per_grounded_answer() -> None:
    per_query = Cost(per_web_search=0.014)
    assert search_cost(per_query, 3) == pytest.approx(0.042)
    per_prompt = Cost(per_grounded_prompt=0.035)  # Gemini 2.x: one grounded prompt, however many queries
    assert search_cost(per_prompt, 3) == pytest.approx(0.035) and search_cost(per_prompt, 0) == 0.0
