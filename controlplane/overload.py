"""Envoy's overload manager: a fixed heap budget (shrink the heap, then stop accepting requests)
and the cap on open downstream connections."""

from __future__ import annotations

import datetime

from envoy.extensions.resource_monitors.downstream_connections.v3 import downstream_connections_pb2  # noqa: F401
from envoy.extensions.resource_monitors.fixed_heap.v3 import fixed_heap_pb2  # noqa: F401  (Any registry)
from envoy_data_plane.envoy.config.overload.v3 import (
    OverloadAction,
    OverloadManager,
    ResourceMonitor,
    ThresholdTrigger,
    Trigger,
)
from envoy_data_plane.envoy.extensions.resource_monitors.downstream_connections.v3 import (
    DownstreamConnectionsConfig,
)
from envoy_data_plane.envoy.extensions.resource_monitors.fixed_heap.v3 import FixedHeapConfig
from envoy_data_plane.google.protobuf import Any as AnyMsg

from controlplane.environments import EdgeSettings, OverloadSettings

FIXED_HEAP = "envoy.resource_monitors.fixed_heap"
DOWNSTREAM_CONNECTIONS = "envoy.resource_monitors.global_downstream_max_connections"


def overload_manager(overload: OverloadSettings, edge: EdgeSettings) -> OverloadManager:
    def at(threshold: float) -> list[Trigger]:
        return [Trigger(name=FIXED_HEAP, threshold=ThresholdTrigger(value=threshold))]

    return OverloadManager(
        refresh_interval=datetime.timedelta(milliseconds=250),
        resource_monitors=[
            ResourceMonitor(name=FIXED_HEAP, typed_config=AnyMsg.pack(
                FixedHeapConfig(max_heap_size_bytes=overload.max_heap_bytes))),
            # Enforced at accept time, no action needed: connection max_connections + 1 is closed at once.
            ResourceMonitor(name=DOWNSTREAM_CONNECTIONS, typed_config=AnyMsg.pack(
                DownstreamConnectionsConfig(max_active_downstream_connections=edge.max_connections))),
        ],
        actions=[
            OverloadAction(name="envoy.overload_actions.shrink_heap", triggers=at(overload.shrink_heap_at)),
            # New requests get a 503 while the heap is this full; requests in flight finish.
            OverloadAction(name="envoy.overload_actions.stop_accepting_requests",
                           triggers=at(overload.stop_accepting_requests_at)),
        ],
    )
