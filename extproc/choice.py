"""The outcome of routing and admission for one request: where it goes and on what terms."""

from __future__ import annotations

from dataclasses import dataclass, field

from extproc.config import Deployment, ModelConfig
from extproc.headers import ARM_HEADER, CHANNEL_HEADER, CLUSTER_HEADER, MODEL_HEADER, STRATEGY_HEADER
from ratelimit import Reservation


@dataclass(slots=True)
class Choice:
    model: ModelConfig
    deployment: Deployment
    channel: str = "standard"
    strategy: str = ""
    arm: str = ""
    reservation: Reservation | None = None
    est_prompt_tokens: int = 0  # charged on arrival; what an aborted stream is metered for its input
    ratelimit_headers: list[tuple[str, str]] = field(default_factory=list)

    def response_headers(self) -> list[tuple[str, str]]:
        out = [(CLUSTER_HEADER, self.deployment.cluster), (MODEL_HEADER, self.model.name),
               (CHANNEL_HEADER, self.channel)]
        if self.strategy:
            out.append((STRATEGY_HEADER, self.strategy))
        if self.arm:
            out.append((ARM_HEADER, self.arm))
        return out + self.ratelimit_headers
