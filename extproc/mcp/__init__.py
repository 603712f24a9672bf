"""The MCP gateway's I/O (docs/mcp.md): upstream calls, the session map, the Gateway's part."""
