"""MCP (JSON-RPC 2.0 over streamable HTTP) as the gateway aggregates it: pure parsing, naming,
merging and error shapes (docs/mcp.md); the I/O is extproc/mcp/'s."""

from adapters.mcp.jsonrpc import (
    INTERNAL_ERROR,
    INVALID_PARAMS,
    INVALID_REQUEST,
    METHOD_NOT_FOUND,
    PARSE_ERROR,
    Message,
    RpcError,
    error_body,
    parse_message,
    render_error,
    result_body,
    sse_event,
)
from adapters.mcp.merge import LISTS, merge_lists
from adapters.mcp.names import join_name, split_name

__all__ = ["INTERNAL_ERROR", "INVALID_PARAMS", "INVALID_REQUEST", "LISTS", "METHOD_NOT_FOUND", "PARSE_ERROR",
           "Message", "RpcError", "error_body", "join_name", "merge_lists", "parse_message", "render_error",
           "result_body", "split_name", "sse_event"]
