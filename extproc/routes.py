"""The route table: method + path -> the caller's protocol and what handles the request.

One ordered list of matchers, built in the composition root (`extproc/service.py`) and injected
into every session, so the session never imports a flow. Each entry either answers from config
(`answer`) or hands the request to a flow that sends it upstream (`flow`). Path grammars belong
to the protocols (`adapters.registry.detect_client_protocol`, `adapters.kserve.match_path`).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

from extproc import messages as msg
from extproc.context import ClientProtocol, Flow, Interim, RequestContext
from extproc.gateway import Gateway

# An answer of the gateway's own; one that reads a store (task polls) is awaited, and one that waits
# on purpose (a long poll) may come back as an Interim first.
Answer = Callable[[Gateway, RequestContext], "msg.ProcessingResponse | Awaitable[msg.ProcessingResponse | Interim]"]
FlowFactory = Callable[[Gateway, RequestContext], Flow]
# A translation hop's flow: the request arrives in the failed primary's protocol, bound for `target`.
HopFactory = Callable[[Gateway, RequestContext, str], Flow]


@dataclass(frozen=True, slots=True)
class Route:
    protocol: ClientProtocol
    path_model: str | None = None
    path_version: str | None = None
    stream: bool = False  # known from the path (Gemini :streamGenerateContent)
    public: bool = False  # answered without an API key
    translatable: bool = False  # a chat request a translation hop may re-render for a peer
    any_key: bool = False  # the API key may come in any protocol's header (task polls)
    admin: bool = False  # the admin API: an admin key (`keys.admin_keys`), not a tenant's
    console: bool = False  # the operator's console: its own sign-in (a session cookie), docs/console.md
    answer: Answer | None = None
    flow: FlowFactory | None = None
    operation: str = "chat"  # gen_ai.operation.name on the request's span (tracing)


Matcher = Callable[[str, str], "Route | None"]
_SEEN_MAX = 4096
_SEEN_PATH_MAX = 256


class RouteTable:
    """The first matcher that claims a request wins; `fallback` answers the rest."""

    def __init__(self, matchers: Sequence[Matcher], *, fallback: Route, hop: HopFactory) -> None:
        self.matchers = tuple(matchers)
        self.fallback = fallback
        self.hop = hop
        self._seen: dict[tuple[str, str], Route] = {}

    def match(self, method: str, path: str) -> Route:
        # Matchers are pure: a path seen before skips the regexes (bounded, as callers choose paths).
        key = (method, path)
        route = self._seen.get(key)
        if route is None:
            route = self._match(method, path)
            if len(path) <= _SEEN_PATH_MAX:
                if len(self._seen) >= _SEEN_MAX:
                    self._seen.clear()
                self._seen[key] = route
        return route

    def _match(self, method: str, path: str) -> Route:
        for matcher in self.matchers:
            route = matcher(method, path)
            if route is not None:
                return route
        return self.fallback
