"""Where a servicer is added: a grpc.aio server, or the extproc's table that serves it on both
grpc.aio and the Unix socket's server (extproc/grpc_services.py, extproc/h2_grpc.py)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

import grpc


class ServiceTable(Protocol):
    def add_generic_rpc_handlers(self, generic_rpc_handlers: Sequence[grpc.GenericRpcHandler]) -> None: ...

    def add_registered_method_handlers(self, service_name: str, method_handlers: dict[str, Any]) -> None: ...
