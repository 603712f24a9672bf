"""`modelyard demo KIND ...`: run one demo upstream."""

from __future__ import annotations

import importlib

_SERVERS = {
    "openai": "devstack.demo.openai_server",
    "anthropic": "devstack.demo.anthropic_server",
    "gemini": "devstack.demo.gemini_server",
    "responses": "devstack.demo.responses_server",
    "kserve": "devstack.demo.kserve_server",
    "azure": "devstack.demo.azure_server",
    "bedrock": "devstack.demo.bedrock_server",
    "vertex": "devstack.demo.vertex_server",
}


def main(argv: list[str]) -> int:
    if not argv or argv[0] not in _SERVERS:
        print(f"usage: modelyard demo {{{'|'.join(_SERVERS)}}} [options]")
        return 2
    return importlib.import_module(_SERVERS[argv[0]]).main(argv[1:]) or 0
