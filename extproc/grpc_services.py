"""The extproc's gRPC services, written once as grpc.aio servicers and served twice: grpc.aio on TCP,
and the Unix socket's server (extproc/h2_grpc.py) on the same method handlers."""

from __future__ import annotations

from collections.abc import Iterable

import grpc


class Services:
    """Stands in for the grpc.aio server while servicers are added: passes each on, keeps its handlers."""

    def __init__(self, server: grpc.aio.Server) -> None:
        self.server = server
        self.handlers: dict[str, grpc.RpcMethodHandler] = {}

    def add_generic_rpc_handlers(self, handlers: Iterable[grpc.GenericRpcHandler]) -> None:
        handlers = tuple(handlers)
        for h in handlers:
            methods = getattr(h, "_method_handlers", None)  # grpc.method_handlers_generic_handler's table
            if not isinstance(methods, dict):
                raise TypeError(f"{type(h).__name__}: only method_handlers_generic_handler tables are served")
            self.handlers.update(methods)
        self.server.add_generic_rpc_handlers(handlers)

    def add_registered_method_handlers(self, service: str, handlers: dict[str, grpc.RpcMethodHandler]) -> None:
        self.server.add_registered_method_handlers(service, handlers)  # the generic table above has them too
