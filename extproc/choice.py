"""The outcome of routing and admission for one request: where it goes and on what terms."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from extproc.config import Deployment, ModelConfig


@dataclass(slots=True)
class Choice:
    model: ModelConfig
    deployment: Deployment
    channel: str = "standard"
    strategy: str = ""
    arm: str = ""
    reservation: Any = None
    ratelimit_headers: list[tuple[str, str]] = field(default_factory=list)

    def response_headers(self) -> list[tuple[str, str]]:
        out = [("x-modelyard-cluster", self.deployment.cluster), ("x-modelyard-model", self.model.name),
               ("x-modelyard-channel", self.channel)]
        if self.strategy:
            out.append(("x-modelyard-strategy", self.strategy))
        if self.arm:
            out.append(("x-modelyard-arm", self.arm))
        return out + self.ratelimit_headers
