"""Several demo upstreams in one process: one event loop, each on its own port, each built from the
command line its own module takes (its `build`). A stack of many demos then pays one interpreter
start and one set of imports instead of one per demo. Test stacks use it (tests/stack_config.py);
`modelyard up` keeps one process per demo, so a demo that dies restarts alone.

    python -m devstack.demo.host devstack.demo.openai_server --port 8101 -- devstack.demo.gemini_server --port 8103
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import signal
import sys

from aiohttp import web

from devstack.demo.adapter_server import DemoSite

SEP = "--"


def segments(argv: list[str]) -> list[tuple[str, list[str]]]:
    """(module, its arguments) for each SEP-separated part of the command line."""
    out: list[tuple[str, list[str]]] = []
    part: list[str] = []
    for arg in [*argv, SEP]:
        if arg != SEP:
            part.append(arg)
        elif part:
            out.append((part[0], part[1:]))
            part = []
    return out


async def _serve(sites: list[DemoSite]) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    runners: list[web.AppRunner] = []
    try:
        # In order: once the last one listens, all do (the stack's readiness probe asks the last).
        for site in sites:
            runner = web.AppRunner(site.app, access_log=None)
            await runner.setup()
            runners.append(runner)
            await web.TCPSite(runner, site.host, site.port).start()
        await stop.wait()
    finally:
        for runner in reversed(runners):
            await runner.cleanup()


def main(argv: list[str] | None = None) -> int:
    parts = segments(sys.argv[1:] if argv is None else argv)
    if not parts:
        print("usage: python -m devstack.demo.host MODULE [ARGS...] [-- MODULE [ARGS...]]...", file=sys.stderr)
        return 2
    sites = [importlib.import_module(module).build(args) for module, args in parts]
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(_serve(sites))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
