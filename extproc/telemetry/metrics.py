"""Prometheus series the extproc exports (default registry, served on extproc.metrics_address)."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from functools import lru_cache

from prometheus_client import REGISTRY, Counter, Gauge, Histogram, start_http_server
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

REQUESTS = Counter("modelyard_requests_total", "Requests handled, by outcome",
                   ["model", "cluster", "status"])
LATENCY = Histogram("modelyard_request_duration_seconds", "Gateway-observed request latency",
                    ["model", "cluster"],
                    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60))
TTFT = Histogram("modelyard_time_to_first_token_seconds", "Time to the first streamed chunk",
                 ["model", "cluster"], buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10))
TOKENS = Counter("modelyard_tokens_total", "LLM tokens metered from upstream usage",
                 ["model", "cluster", "direction"])
COST = Counter("modelyard_cost_total", "Cost metered from usage and the model's price per 1K tokens",
               ["model", "tenant"])
# The prompt-cache part of the input tokens (already in modelyard_tokens_total's input), and what
# it saved against the full input price (negative where writes cost more than they saved).
CACHE_TOKENS = Counter("modelyard_cache_tokens_total", "Prompt tokens read from or written to the provider's cache",
                       ["model", "cluster", "kind"])
CACHE_SAVED = Counter("modelyard_cache_saved_total", "Cost the prompt cache saved against the full input price",
                      ["model", "tenant"])
# Images, seconds of audio and characters of speech (/v1/images, /v1/audio), as each provider bills them.
MEDIA_UNITS = Counter("modelyard_media_units_total", "Images, audio seconds and speech characters metered",
                      ["model", "unit"])
# Web searches a provider ran as a tool (Gemini's grounding, a Responses web_search call), billed apart from tokens.
WEB_SEARCHES = Counter("modelyard_web_searches_total", "Web searches upstream tools ran, as their providers bill them",
                       ["model", "cluster"])
CHANNEL = Counter("modelyard_channel_requests_total", "Requests by serving channel",
                  ["channel", "tier"])
STREAMS = Gauge("modelyard_extproc_open_streams", "ext_proc streams open now")
ERRORS = Counter("modelyard_errors_total", "Requests answered with an error by the gateway",
                 ["protocol", "status"])
# The key store's copy on this worker: how many live keys, and when a refresh last read the store.
STORE_KEYS = Gauge("modelyard_key_store_keys", "Live keys from the key store on this worker")
STORE_REFRESHED = Gauge("modelyard_key_store_refreshed_timestamp_seconds",
                        "When this worker last read the key store (unix seconds)")
STORE_REFRESH_FAILURES = Counter("modelyard_key_store_refresh_failures_total",
                                 "Key store refreshes that failed (the last keys read keep serving)")
KEY_LOOKUPS = Counter("modelyard_key_store_lookups_total",
                      "Store lookups of keys this worker's copy did not know, by result (found, absent, failed)",
                      ["result"])
KEY_LOOKUPS_SKIPPED = Counter("modelyard_key_store_lookups_skipped_total",
                              "Unknown keys refused without a store lookup, by reason (absent, limited, down)",
                              ["reason"])
# drop_params (contracts/params.py): controls a deployment's protocol cannot express, dropped.
DROPPED_PARAMS = Counter("modelyard_dropped_params_total",
                         "Request parameters dropped because the deployment's protocol cannot express them",
                         ["model", "deployment", "param"])
# Answers past extproc.max_body_bytes: passed through untranslated, or refused (502) where they needed translating.
ANSWERS_OVER_LIMIT = Counter("modelyard_answers_over_limit_total",
                             "Upstream answers larger than extproc.max_body_bytes, by what became of them",
                             ["model", "deployment", "outcome"])
# Guardrails (docs/guardrails.md): one per call and policy, check, action and side; never what matched.
GUARDRAIL_VERDICTS = Counter("modelyard_guardrail_verdicts_total", "Guardrail checks that matched, by what they did",
                             ["policy", "check", "action", "direction"])
IMAGE_BACKEND = Gauge("modelyard_image_backend_info", "Image preprocessing path in use (1 = active)",
                      ["backend"])
# contracts/compiled.py: the request path's mypyc-compiled modules, or the pure-Python ones.
BUILD = Gauge("modelyard_extproc_build_info", "The request path's build in use (1 = active)", ["build"])


def serve_metrics(address: str) -> None:
    """Serve /metrics from a daemon thread, off the event loop."""
    host, _, port = address.rpartition(":")
    start_http_server(int(port), addr=host or "0.0.0.0")


@lru_cache(maxsize=4096)
def model_series(model: str, cluster: str) -> tuple:
    """Label children per (model, cluster), cached: `labels()` costs more than the increment."""
    return (LATENCY.labels(model, cluster), TTFT.labels(model, cluster),
            TOKENS.labels(model, cluster, "input"), TOKENS.labels(model, cluster, "output"))


@lru_cache(maxsize=4096)
def requests_series(model: str, cluster: str, status: int) -> Counter:
    return REQUESTS.labels(model, cluster, str(status))


@lru_cache(maxsize=4096)
def channel_series(channel: str, tier: str) -> Counter:
    return CHANNEL.labels(channel, tier)


@lru_cache(maxsize=4096)
def cache_series(model: str, cluster: str, tenant: str) -> tuple[Counter, Counter, Counter]:
    """(read tokens, written tokens, saved cost) label children, cached like model_series."""
    return CACHE_TOKENS.labels(model, cluster, "read"), CACHE_TOKENS.labels(model, cluster, "write"), \
        CACHE_SAVED.labels(model, tenant)


# The same cost by where it ran: how much dearer the fast channel is, which deployment spends.
DEPLOYMENT_COST = Counter("modelyard_deployment_cost_total", "Cost metered per deployment (cluster) and its channel",
                          ["cluster", "channel"])


@lru_cache(maxsize=4096)
def cost_series(model: str, tenant: str, cluster: str, channel: str) -> tuple[Counter, Counter]:
    return COST.labels(model, tenant), DEPLOYMENT_COST.labels(cluster, channel)

# Dynamic batching of image inference (extproc/vision/batching.py).
BATCH_SIZE = Histogram("modelyard_batch_size", "Rows (images, texts, embeddings inputs) per merged upstream call", ["model"],
                       buckets=(1, 2, 4, 8, 12, 16, 24, 32))
BATCH_MEMBERS = Histogram("modelyard_batch_members", "Requests merged into one upstream call", ["model"],
                          buckets=(1, 2, 4, 8, 12, 16, 24, 32))
BATCH_QUEUE_DELAY = Histogram("modelyard_batch_queue_delay_seconds",
                              "Time a request waited in its batch before the merged call left", ["model"],
                              buckets=(0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1))
BATCH_FALLBACKS = Counter("modelyard_batch_fallbacks_total",
                          "Batch members that fell back to their own upstream call (the leader failed)",
                          ["model"])

METERING_DROPPED = Counter("modelyard_metering_rows_dropped_total",
                           "Metering rows not written: queue_full (refused at the door), bad_row, "
                           "held_full (the disk refused them and the in-memory retry buffer was full)",
                           ["reason"])
METERING_HELD = Gauge("modelyard_metering_rows_held",
                      "Metering rows the disk refused (full, I/O error), kept in memory and retried every second")
METERING_WRITE_ERRORS = Counter("modelyard_metering_write_errors_total",
                                "Metering batches SQLite refused for a reason of the disk's (full, I/O error, locked)")

FAIL_OPEN = Counter("modelyard_routing_fail_open_total",
                    "Routing decisions that set a check aside rather than refuse every deployment "
                    "(cooldown: all cooling down; watermarks: no fresh reading anywhere)", ["check"])
FAIL_OPEN_ACTIVE = Gauge("modelyard_routing_fail_open_models",
                         "Models whose last routing decision set this check aside", ["check"])

# Warm-up (extproc/telemetry/warmup.py).
WARMING = Gauge("modelyard_deployment_warming", "1 while a deployment's warm-up request has not answered", ["cluster"])
WARMUPS = Counter("modelyard_warmups_total", "Warm-ups by how they ended: ok, timeout (routed to anyway), cancelled",
                  ["cluster", "outcome"])

# Watermark freshness per monitored cluster (extproc/telemetry/pollers.py): alerts see a silent agent.
WATERMARK_READ_AT = Gauge("modelyard_watermark_last_reading_timestamp_seconds",
                          "Unix time of the last good watermark reading", ["cluster"])
WATERMARK_POLL_ERRORS = Counter("modelyard_watermark_poll_errors_total",
                                "Watermark polls that failed (unreachable, HTTP error, unreadable body)", ["cluster"])
REPLICA_POLL_ERRORS = Counter("modelyard_replica_poll_errors_total",
                              "Replica metrics polls that failed (unreachable, HTTP error, unreadable body)",
                              ["cluster", "endpoint"])
REPLICA_PICKS = Counter("modelyard_replica_picks_total",
                        "Calls the replica picker sent to one endpoint (endpoint=\"\": none fresh, Envoy balanced)",
                        ["cluster", "endpoint"])
EPP_DECISIONS = Counter("modelyard_epp_decisions_total",
                        "Endpoint-picker mode: requests picked, or refused (no_ready 503, shed 429, bad_request)",
                        ["pool", "outcome"])

# Tokens by tenant: what a tenant consumed across models (modelyard_tokens_total is per model and cluster).
TENANT_TOKENS = Counter("modelyard_tenant_tokens_total", "LLM tokens metered from upstream usage, per tenant",
                        ["tenant", "direction"])


@lru_cache(maxsize=4096)
def tenant_token_series(tenant: str) -> tuple[Counter, Counter]:
    """(input, output) label children per tenant, cached like model_series."""
    return TENANT_TOKENS.labels(tenant, "input"), TENANT_TOKENS.labels(tenant, "output")


# Audit log (extproc/telemetry/audit.py).
AUDIT_BACKLOG = Gauge("modelyard_audit_queue_rows", "audit rows queued for the writer thread")
AUDIT_ROWS = Counter("modelyard_audit_rows_total", "audit rows written")
AUDIT_DROPPED = Counter("modelyard_audit_dropped_total", "audit rows SQLite cannot bind (a bug; logged)")
AUDIT_WRITE_ERRORS = Counter("modelyard_audit_write_errors_total",
                              "audit batch writes SQLite refused (full disk, I/O error, locked); the rows are retried")
AUDIT_REFUSED = Counter("modelyard_audit_refused_total", "calls refused because the audit writer is behind")

# Concurrency limits and the per-deployment queues (extproc/admission/concurrency.py).
QUEUE_DEPTH = Gauge("modelyard_queue_depth", "Requests waiting for a slot of a deployment, by tier",
                    ["model", "cluster", "tier"])
QUEUE_WAIT = Histogram("modelyard_queue_wait_seconds",
                       "Time a request waited for a deployment's slot (0 when one was free)",
                       ["model", "cluster", "tier"],
                       buckets=(0.0, 0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30))
SPILLED = Counter("modelyard_spilled_total",
                  "Calls a deployment's own cluster bucket or queue refused, sent to a peer deployment of "
                  "the same model instead (reason: cluster_bucket, bound, tenant_share)",
                  ["model", "from_cluster", "to_cluster", "reason"])
QUEUE_REFUSED = Counter("modelyard_queue_refused_total",
                        "Requests refused by a deployment's queue: tenant_share (429), bound or max_wait (503)",
                        ["cluster", "tier", "reason"])
INFLIGHT = Gauge("modelyard_inflight", "Requests holding a slot of a deployment with max_inflight",
                 ["cluster"])


class DeploymentStates(Collector):
    """`modelyard_deployment_state{cluster,state}`: 1 for the state each deployment is in now, read at
    scrape time from the routing state (`source`, set by the composition root), so it is never stale."""

    STATES = ("ready", "busy", "queueing", "cooldown", "warming")

    def __init__(self) -> None:
        self.source: Callable[[], Mapping[str, str]] | None = None

    def collect(self) -> Iterator[GaugeMetricFamily]:
        g = GaugeMetricFamily("modelyard_deployment_state",
                              "1 for the state a deployment is in: ready, busy (every slot taken), queueing, "
                              "cooldown, warming", labels=["cluster", "state"])
        for cluster, state in (self.source() if self.source is not None else {}).items():
            for s in self.STATES:
                g.add_metric([cluster, s], 1.0 if s == state else 0.0)
        yield g


DEPLOYMENT_STATES = DeploymentStates()
REGISTRY.register(DEPLOYMENT_STATES)

# (cluster, endpoint, field -> value, LoRA adapters loaded) per replica: what the picker reads now.
ReplicaState = tuple[str, str, Mapping[str, float], frozenset[str]]


class ReplicaStates(Collector):
    """`modelyard_replica_state{cluster,endpoint,field}` (waiting, running, kv_usage, max_lora,
    age_seconds, in_flight, held_seconds) and `modelyard_replica_loras{cluster,endpoint,adapter}`, read
    at scrape time from the replica board (`source`, set when its pollers start): what the picker
    sees now, which `modelyard route explain --live` replays."""

    def __init__(self) -> None:
        self.source: Callable[[], Iterator[ReplicaState]] | None = None

    def collect(self) -> Iterator[GaugeMetricFamily]:
        g = GaugeMetricFamily("modelyard_replica_state",
                              "What the replica picker reads per endpoint: the server's waiting, running, kv_usage "
                              "and max_lora, the reading's age_seconds, the gateway's in_flight, held_seconds left "
                              "after a failure", labels=["cluster", "endpoint", "field"])
        lora = GaugeMetricFamily("modelyard_replica_loras", "1 per LoRA adapter a replica reports loaded",
                                 labels=["cluster", "endpoint", "adapter"])
        for cluster, endpoint, fields, adapters in (self.source() if self.source is not None else ()):
            for name, value in fields.items():
                g.add_metric([cluster, endpoint, name], value)
            for a in sorted(adapters):
                lora.add_metric([cluster, endpoint, a], 1.0)
        yield g
        yield lora


REPLICA_STATES = ReplicaStates()
REGISTRY.register(REPLICA_STATES)


class LatencyObjectives(Collector):
    """`modelyard_latency_objective{cluster,field}`: each deployment with an `slo:`, measured now
    (p99_seconds, p99_samples, ttft_seconds, ttft_samples, over 0|1), read at scrape time from the
    scheduler (`source`, set by the composition root); `modelyard route explain --live` replays it."""

    def __init__(self) -> None:
        self.source: Callable[[], Iterator[tuple[str, Mapping[str, float]]]] | None = None

    def collect(self) -> Iterator[GaugeMetricFamily]:
        g = GaugeMetricFamily("modelyard_latency_objective",
                              "A deployment against its latency objective over the window: p99_seconds, "
                              "p99_samples, ttft_seconds, ttft_samples, over (1: counts as loaded)",
                              labels=["cluster", "field"])
        for cluster, fields in (self.source() if self.source is not None else ()):
            for name, value in fields.items():
                g.add_metric([cluster, name], value)
        yield g


LATENCY_OBJECTIVES = LatencyObjectives()
REGISTRY.register(LATENCY_OBJECTIVES)

# Live reload (extproc/live/reload.py): the running config's version (a content hash), and every reload.
CONFIG_INFO = Gauge("modelyard_config_info", "1 for the config version (content hash) this process runs",
                    ["version"])
CONFIG_RELOADS = Counter("modelyard_config_reloads_total", "Config reloads by source (sighup, controlplane) "
                         "and outcome (applied, refused)", ["source", "outcome"])
# Budgets (extproc/admission/budget_guard.py): set by the ledger's sync thread for every budget in use.
BUDGET_USED = Gauge("modelyard_budget_used_ratio", "Spend this period over the budget (1 = spent; refused from there)",
                    ["scope", "id", "period"])
BUDGET_SPENT = Gauge("modelyard_budget_spent_usd", "Spend this budget period, by key or tenant",
                     ["scope", "id", "period"])
BUDGET_USD = Gauge("modelyard_budget_usd", "The budget's cap for its period", ["scope", "id", "period"])
BUDGET_SOFT_CROSSINGS = Counter("modelyard_budget_soft_crossings_total",
                                "Budgets that passed their soft share in a period (each announced once)", ["scope"])
BUDGET_REFUSED = Counter("modelyard_budget_refused_total", "Calls refused because a budget was spent (429)",
                         ["scope"])
BUDGET_SYNC_ERRORS = Counter("modelyard_budget_sync_errors_total",
                             "Spend ledger writes or reads that failed (retried on the next round)", ["op"])

# Scale from zero (extproc/admission/waking.py): replicas asked for, readiness, time from a held caller to ready.
SCALE_REQUESTS = Counter("modelyard_scale_requests_total",
                         "Requests for a replica of a scale_from_zero deployment, by outcome (ok, refused, failed)",
                         ["cluster", "outcome"])
SCALE_READY = Gauge("modelyard_scale_ready", "1 while a scale_from_zero deployment has a ready replica, 0 while "
                    "its callers are held", ["cluster"])
SCALE_FROM_ZERO_SECONDS = Histogram("modelyard_scale_from_zero_seconds",
                                    "From the first caller held to the replica ready and warmed", ["cluster"],
                                    buckets=(0.5, 1, 2.5, 5, 10, 20, 30, 60, 120, 300))

# Routing that learns (docs/routing.md, "The learning strategy"): the bandit's picks per arm, every call
# of an A/B or bandit arm with its outcome and cost (Grafana's arm panels), trips of group breakers.
BANDIT_PICKS = Counter("modelyard_bandit_picks_total", "Calls the learning strategy sent to each deployment (arm)",
                       ["model", "channel", "cluster"])
ARM_CALLS = Counter("modelyard_arm_calls_total", "Calls of each A/B or bandit arm by outcome (ok, error)",
                    ["strategy", "arm", "outcome"])
ARM_COST = Counter("modelyard_arm_cost_total", "Cost of each A/B or bandit arm's calls", ["strategy", "arm"])
ARM_REWARD = Counter("modelyard_arm_reward_total", "Reward the learning strategy counted per arm (sum; "
                     "divide by modelyard_arm_calls_total for the mean)", ["strategy", "arm"])
BREAKER_TRIPS = Counter("modelyard_breaker_trips_total", "Times a group breaker opened (reason error_rate: a "
                        "model's or a channel's combined error rate passed its threshold; reason share: one "
                        "model took more than its share of a group's calls)", ["group", "reason"])


class LearningState(Collector):
    """`modelyard_bandit_arm{model,channel,tenant,cluster,field}` (share: its probability now,
    reward: posterior mean, evidence: decayed calls) and `modelyard_breaker_state{group}` (0 closed,
    1 open, 2 half-open), read at scrape time from the scheduler (`source`, set by the composition root)."""

    def __init__(self) -> None:
        self.source: Callable[[], tuple[Iterator[tuple[tuple[str, str, str], str, Mapping[str, float]]],
                                        Mapping[str, int]]] | None = None

    def collect(self) -> Iterator[GaugeMetricFamily]:
        arms = GaugeMetricFamily("modelyard_bandit_arm", "The learning strategy's arms: share (probability of "
                                 "being picked now), reward (posterior mean), evidence (decayed calls)",
                                 labels=["model", "channel", "tenant", "cluster", "field"])
        breakers = GaugeMetricFamily("modelyard_breaker_state", "A group breaker's state: 0 closed, 1 open, "
                                     "2 half-open", labels=["group"])
        if self.source is not None:
            rows, states = self.source()
            for (model, channel, tenant), cluster, fields in rows:
                for name, value in fields.items():
                    arms.add_metric([model, channel, tenant, cluster, name], value)
            for group, value in states.items():
                breakers.add_metric([group], float(value))
        yield arms
        yield breakers


LEARNING_STATE = LearningState()
REGISTRY.register(LEARNING_STATE)
