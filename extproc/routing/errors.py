"""Why a request cannot be routed: `NoRoute` and its three cases, each in the one error tree."""

from __future__ import annotations

from collections.abc import Iterable

from contracts.errors import ClientError, ModelyardError, Unavailable, UnknownModel
from extproc.routing.decision import Rejection


class NoRoute(ModelyardError):
    """No deployment can take the request; `rejected` says why each one was dropped.
    Raised as one of its subclasses, which carry the status."""

    def __init__(self, message: str, *, rejected: tuple[Rejection, ...] = (), status: int | None = None,
                 type: str | None = None, headers: Iterable[tuple[str, str]] = ()) -> None:
        super().__init__(message, status=status, type=type, headers=headers)
        self.rejected = rejected


class ModelNotFound(NoRoute, UnknownModel):
    """404: an unknown model and one the tenant may not use read the same, so tenants cannot probe."""


class BadRouteRequest(NoRoute, ClientError):
    """400: an unknown strategy, or a request no model can serve (no retry will help)."""


class NoCapacity(NoRoute, Unavailable):
    """503: every capable deployment is cooling down, saturated or unread; `retry_after_s` is set
    when every one of them is cooling down."""

    def __init__(self, message: str, *, rejected: tuple[Rejection, ...] = (),
                 retry_after_s: float | None = None) -> None:
        # Routing's 503s have always been typed api_error on the wire, not overloaded_error.
        Unavailable.__init__(self, message, retry_after_s=retry_after_s, type="api_error")
        self.rejected = rejected
