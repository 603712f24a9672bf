"""Header names shared by the Envoy config and the session: the contract between the two."""

CLUSTER_HEADER = "x-modelyard-cluster"  # set by the extproc, read by the route's cluster_header
UPSTREAM_CLUSTER_HEADER = "x-modelyard-upstream-cluster"  # set by the route: who actually answered
TENANT_HEADER = "x-modelyard-tenant"  # rate limit descriptor for Envoy's ratelimit filter
TASK_ID_HEADER = "x-modelyard-task-id"
STRATEGY_HEADER = "x-modelyard-strategy"
CHANNEL_HEADER = "x-modelyard-channel"
