"""Per-deployment facts a cloud upstream's renderer needs beside the request: where the model
lives (deployment paths, region, project) and the credentials current for this call.

The extproc resolves them (credential refresh is I/O and runs off the event loop); the adapters
only read them, so rendering stays pure. Secrets here are never logged: `repr` hides them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

__all__ = ["AzureTarget", "AwsCredentials", "BedrockTarget", "VertexTarget", "CloudTarget"]


@dataclass(frozen=True, slots=True)
class AzureTarget:
    api_version: str
    # "api-key": the `api-key` header; "entra": an Entra ID access token as `Authorization: Bearer`.
    auth: Literal["api-key", "entra"] = "api-key"


@dataclass(frozen=True, slots=True)
class AwsCredentials:
    access_key: str
    secret_key: str = field(repr=False)
    session_token: str | None = field(default=None, repr=False)


@dataclass(frozen=True, slots=True)
class BedrockTarget:
    region: str
    host: str  # the Host the request is signed for (and sent with): SigV4 covers it
    credentials: AwsCredentials | None = None


@dataclass(frozen=True, slots=True)
class VertexTarget:
    project: str
    location: str
    publisher: Literal["google", "anthropic"] = "google"


CloudTarget = AzureTarget | BedrockTarget | VertexTarget
