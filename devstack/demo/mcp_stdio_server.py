"""Demo local MCP server over stdio (FastMCP): `modelyard up` runs it behind devstack.mcp_bridge.

    python -m devstack.demo.mcp_stdio_server [--name demo-stdio]
"""

from __future__ import annotations

import argparse

from devstack.demo.mcp_tools import build


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="demo MCP server over stdio")
    p.add_argument("--name", default="demo-stdio")
    build(p.parse_args(argv).name).run("stdio")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
