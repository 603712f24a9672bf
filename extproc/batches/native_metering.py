"""A native batch's lines metered when the provider's results come back (docs/batches.md "Native
batches"): each line the provider answered is a `requests` row (strategy `native-batch`), the
Prometheus series and spend of the tenant and the key that made the batch, with the tokens the
provider reported, at the model's (or deployment's) price less its `batch_discount`.
"""

from __future__ import annotations

import time

from budgets.pricing import charge
from contracts.config import Deployment, ModelConfig
from extproc.admission.budget_guard import BudgetGuard
from extproc.batches.native import LineResult
from extproc.batches.record import BatchRecord
from extproc.telemetry.metering import MeteringStore, MeterRecord
from extproc.telemetry.metrics import cost_series, model_series, requests_series

STRATEGY = "native-batch"  # the metering row's strategy column: how the line was run


def meter_lines(rec: BatchRecord, dep: Deployment, model: ModelConfig, results: dict[int, LineResult], *,
                tier: str, metering: MeteringStore | None, budgets: BudgetGuard | None) -> None:
    price = dep.cost or model.cost
    key_id = (rec.native or {}).get("key_id")
    _, _, tokens_in, tokens_out = model_series(model.name, dep.cluster)
    for ref in rec.lines:
        res = results.get(ref.index)
        if ref.task_id is None or res is None or res.status is None:
            continue  # refused before it ran, or the provider never answered it: nothing was billed
        usage = res.usage
        tin, tout = (usage.input_tokens, usage.output_tokens) if usage is not None else (0, 0)
        read, write, write_1h = (usage.cache.read, usage.cache.write, usage.cache.write_1h) if usage else (0, 0, 0)
        cost, saved = charge(price, tin, tout, read, write, write_1h)
        cost *= 1.0 - (price.batch_discount or 0.0)
        requests_series(model.name, dep.cluster, res.status).inc()
        tokens_in.inc(tin)
        tokens_out.inc(tout)
        if cost:
            by_model, by_deployment = cost_series(model.name, rec.tenant, dep.cluster, dep.channel)
            by_model.inc(cost)
            by_deployment.inc(cost)
            if budgets is not None:
                budgets.record_spend(rec.tenant, key_id, cost)
        if metering is not None:
            # By name, not position: a column added to the table must not shift this row's values.
            metering.record(MeterRecord(
                ts=time.time(), task_id=ref.task_id, tenant=rec.tenant, tier=tier, model=model.name,
                cluster=dep.cluster, channel=dep.channel, status=res.status, latency_ms=0.0, ttft_ms=None,
                input_tokens=tin, output_tokens=tout, cost=cost, strategy=STRATEGY, arm="", key_id=key_id,
                cache_read_tokens=read, cache_write_tokens=write, cache_write_1h_tokens=write_1h, cache_saved=saved))
