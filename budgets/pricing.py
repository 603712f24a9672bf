"""One call's price as the provider invoices it: uncached input, cached reads, cache writes (5-minute
and 1-hour) and output each at their own price, the step that the prompt's length falls in; and what
the cache saved against every prompt token at the input price (negative when writes cost more)."""

from __future__ import annotations

from typing import NamedTuple

from contracts.config import Cost


class Charge(NamedTuple):
    cost: float
    saved: float  # the same call with no prompt cache, minus `cost`


def _step(price: Cost, prompt_tokens: int) -> tuple[float, float, float, float, float]:
    """(input, output, cached read, 5-minute write, 1-hour write) per 1k for a prompt this long."""
    i, o = price.input_per_1k, price.output_per_1k
    read, write, write_1h = price.cached_input_per_1k, price.cache_write_per_1k, price.cache_write_1h_per_1k
    for s in price.long_prompt:  # ascending: the last one passed holds
        if prompt_tokens > s.above_prompt_tokens:
            i = s.input_per_1k if s.input_per_1k is not None else i
            o = s.output_per_1k if s.output_per_1k is not None else o
            read = s.cached_input_per_1k if s.cached_input_per_1k is not None else read
            write = s.cache_write_per_1k if s.cache_write_per_1k is not None else write
            write_1h = s.cache_write_1h_per_1k if s.cache_write_1h_per_1k is not None else write_1h
    read = i if read is None else read
    write = i if write is None else write
    return i, o, read, write, write if write_1h is None else write_1h


def charge(price: Cost, input_tokens: int, output_tokens: int, cache_read: int = 0, cache_write: int = 0,
           cache_write_1h: int = 0) -> Charge:
    """`input_tokens` counts every prompt token, the cache's included (the hub's `Usage`)."""
    i, o, read, write, write_1h = _step(price, input_tokens)
    uncached = max(0, input_tokens - cache_read - cache_write)
    cost = (uncached * i + cache_read * read + (cache_write - cache_write_1h) * write + cache_write_1h * write_1h
            + output_tokens * o) / 1000
    full = (input_tokens * i + output_tokens * o) / 1000
    return Charge(cost, full - cost)


def search_cost(price: Cost, searches: int) -> float:
    """The web searches an answer ran, as the provider bills them: per search, and per answer that searched."""
    return searches * price.per_web_search + (price.per_grounded_prompt if searches else 0.0)
