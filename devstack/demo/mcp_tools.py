"""What both demo MCP servers offer (FastMCP, the official SDK): the same tool names on purpose
(`echo`, `add`), so the gateway's `<server>__<tool>` names are what tells them apart."""

from __future__ import annotations

import asyncio
import os

from mcp.server.fastmcp import Context, FastMCP


def build(name: str) -> FastMCP:
    server = FastMCP(name, instructions=f"Modelyard's demo MCP server {name}")

    @server.tool()
    def echo(text: str) -> str:
        """Say `text` back, naming the server that answered."""
        return f"[{name}] {text}"

    @server.tool()
    def add(a: float, b: float) -> float:
        """a + b."""
        return a + b

    @server.tool()
    async def count_slowly(n: int, ctx: Context, step_ms: int = 20) -> str:
        """Count to n (at most 50), a step every step_ms (at most 2000), reporting progress at each."""
        n = max(1, min(n, 50))
        for i in range(1, n + 1):
            await ctx.report_progress(i, n, f"counted {i} of {n}")
            await asyncio.sleep(max(0, min(step_ms, 2000)) / 1000)
        return f"[{name}] counted to {n}"

    @server.tool()
    async def announce(text: str, ctx: Context) -> str:
        """Send `text` as a log message on the session's own stream (GET), not this call's answer."""
        # No related request: the SDK's transport puts it on the standalone GET stream.
        await ctx.session.send_log_message(level="info", data=text, logger=name)
        return f"[{name}] announced"

    @server.tool()
    async def crash(ctx: Context) -> str:
        """Report progress once, then exit the server process mid-call (for failure drills)."""
        await ctx.report_progress(1, 2, "about to crash")
        await asyncio.sleep(0.05)
        os._exit(3)

    @server.prompt()
    def summarize(text: str) -> str:
        """Ask for a one-line summary of `text`."""
        return f"Summarize in one line: {text}"

    @server.resource(f"demo://{name}/readme")
    def readme() -> str:
        """What this server is."""
        return f"{name}: a demo MCP server started by `modelyard up`."

    return server
