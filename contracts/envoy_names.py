"""Names the Envoy config (controlplane) and the extproc must agree on: headers, gRPC metadata,
clusters and internal listeners."""

CLUSTER_HEADER = "x-modelyard-cluster"  # set by the extproc, read by the route's cluster_header


def grpc_bridge_cluster(cluster: str) -> str:
    """The internal listener (and its cluster) that carries a gRPC caller's call to the REST
    deployment `cluster` through Envoy's grpc_http1_reverse_bridge: frame and grpc-status trailers."""
    return f"grpcbridge~{cluster}"


# The ext_proc filter's name: Envoy keys the attributes it sends the extproc by it.
EXT_PROC_FILTER = "envoy.filters.http.ext_proc"
# The request attribute the extproc reads the caller's address from (trusted XFF hops applied).
SOURCE_ADDRESS_ATTRIBUTE = "source.address"
# Envoy's cluster of extproc replicas; the session routes calls the extproc answers itself to it.
EXTPROC_CLUSTER = "modelyard-extproc"
# Set by the route on the answer: which endpoint answered and after how many attempts, so the
# extproc can tell when Envoy failed over to a peer deployment.
UPSTREAM_HOST_HEADER = "x-modelyard-upstream-host"
UPSTREAM_ATTEMPTS_HEADER = "x-modelyard-upstream-attempts"
# The replica the extproc picked, read by the cluster's override-host LB policy (the name the
# Gateway API Inference Extension's endpoint pickers use); absent, Envoy's own balancer picks.
DESTINATION_ENDPOINT_HEADER = "x-gateway-destination-endpoint"
# The Endpoint Picker Protocol's metadata (`modelyard epp`): the pick in the ext_proc reply's dynamic
# metadata (namespace, key DESTINATION_ENDPOINT_HEADER), the proxy's subset hint in the request's.
EPP_DESTINATION_NAMESPACE = "envoy.lb"
EPP_SUBSET_NAMESPACE = "envoy.lb.subset_hint"
EPP_SUBSET_KEY = "x-gateway-destination-endpoint-subset"
TENANT_HEADER = "x-modelyard-tenant"  # rate limit descriptor for Envoy's ratelimit filter
TASK_ID_HEADER = "x-modelyard-task-id"
STRATEGY_HEADER = "x-modelyard-strategy"
CHANNEL_HEADER = "x-modelyard-channel"
# Envoy's router reads (and strips) it: the chosen deployment's timeout_ms bounds the upstream call.
UPSTREAM_TIMEOUT_HEADER = "x-envoy-upstream-rq-timeout-ms"
MODEL_HEADER = "x-modelyard-model"
ARM_HEADER = "x-modelyard-arm"  # the A/B arm a request fell in
# A long poll (GET /v1/tasks/{id}?wait=N) asks Envoy once (ext_proc override_message_timeout) for
# N seconds plus this margin on its message; the bootstrap's max_message_timeout allows it for any
# N up to extproc.tasks.max_wait_s (Envoy honours one override per message).
WAIT_MARGIN_S = 2.0
# gRPC metadata on a translation hop's ext_proc streams: "<from protocol>~<target cluster>".
XLATE_METADATA = "x-modelyard-xlate"
# gRPC metadata on an ext_proc stream whose route runs the bodies FULL_DUPLEX_STREAMED: "duplex"
# (controlplane.bootstrap's per-route override; extproc/duplex.py speaks it).
BODIES_METADATA = "x-modelyard-bodies"
# Beside it: the environment's buffer_limit_bytes, the most of a body the extproc gathers (Envoy buffers none).
BUFFER_LIMIT_METADATA = "x-modelyard-buffer-limit"
# On a reply from a deployment with max_inflight: milliseconds the request waited for a slot.
QUEUE_WAIT_HEADER = "x-modelyard-queue-wait-ms"
# On a reply that a peer deployment took after the chosen one's cluster bucket or queue refused it:
# the clusters that refused, in order (docs/routing.md, "Spill").
SPILLED_FROM_HEADER = "x-modelyard-spilled-from"
# On a reply whose request lost controls its deployment cannot express (drop_params): their names.
DROPPED_PARAMS_HEADER = "x-modelyard-dropped-params"
# On a reply whose output cap was lowered to the model's max_output_tokens (routing.output_limit: clamp):
# `<asked>-><sent>`.
OUTPUT_CLAMPED_HEADER = "x-modelyard-output-clamped"
CACHE_HEADER = "x-modelyard-cache"  # hit | miss | bypass: the response cache's verdict (docs/cache.md)

# A deployment with failover peers: Envoy's aggregate cluster `<cluster>~failover` (contracts/failover.py).
FAILOVER_SUFFIX = "~failover"
# A translation hop: the internal listener (and its cluster) `xlate~<from protocol>~<target cluster>`.
XLATE_PREFIX = "xlate~"


def aggregate_name(cluster: str) -> str:
    return cluster + FAILOVER_SUFFIX


def xlate_name(from_protocol: str, cluster: str) -> str:
    return f"{XLATE_PREFIX}{xlate_metadata(from_protocol, cluster)}"


def parse_xlate(name: str) -> tuple[str, str] | None:
    """`xlate~openai~demo-claude` -> ("openai", "demo-claude"); None for anything else."""
    if not name.startswith(XLATE_PREFIX):
        return None
    return parse_xlate_metadata(name[len(XLATE_PREFIX):])


def xlate_metadata(from_protocol: str, cluster: str) -> str:
    """The value of `XLATE_METADATA` on a hop's ext_proc streams: `<from protocol>~<target cluster>`."""
    return f"{from_protocol}~{cluster}"


def parse_xlate_metadata(value: str) -> tuple[str, str] | None:
    """`openai~demo-claude` -> ("openai", "demo-claude"); None without a `~` and a cluster."""
    from_protocol, sep, cluster = value.partition("~")
    return (from_protocol, cluster) if sep and cluster else None
# /mcp streams (docs/mcp.md "Streams and resumption"): the extproc authorises a call or a GET, then
# Envoy carries it to that extproc's own SSE relay: an ORIGINAL_DST cluster dialling the address
# the extproc put in MCP_RELAY_HEADER; MCP_TICKET_HEADER names the job it prepared for it.
MCP_RELAY_CLUSTER = "modelyard-mcp-relay"
MCP_RELAY_HEADER = "x-modelyard-mcp-relay"
MCP_TICKET_HEADER = "x-modelyard-mcp-ticket"
