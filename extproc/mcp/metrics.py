"""The MCP gateway's Prometheus series: calls and their latency per server and tool."""

from __future__ import annotations

from prometheus_client import Counter, Histogram

CALLS = Counter("modelyard_mcp_calls_total", "MCP tool calls through the gateway, by server, tool and outcome",
                ["server", "tool", "status"])
LATENCY = Histogram("modelyard_mcp_call_duration_seconds", "MCP tool call latency as the gateway saw it",
                    ["server", "tool"])
UPSTREAM = Counter("modelyard_mcp_upstream_requests_total", "JSON-RPC messages sent to MCP servers, by method",
                   ["server", "method", "status"])
STREAMS = Counter("modelyard_mcp_streams_total", "SSE streams the MCP relay served: call (a tools/call), "
                  "listen (GET), resume (GET with Last-Event-ID)", ["kind"])
EVENTS = Counter("modelyard_mcp_stream_events_total", "SSE events the MCP relay wrote: live, or replayed on a resume",
                 ["how"])
