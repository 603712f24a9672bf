"""The outcome of routing and admission for one request: where it goes and on what terms."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from contracts.config import Deployment, ModelConfig
from contracts.envoy_names import (
    ARM_HEADER,
    CHANNEL_HEADER,
    CLUSTER_HEADER,
    MODEL_HEADER,
    QUEUE_WAIT_HEADER,
    SPILLED_FROM_HEADER,
    STRATEGY_HEADER,
)
from ratelimit import Reservation

if TYPE_CHECKING:
    from extproc.admission.concurrency import Slot


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
    slot: Slot | None = None  # held on a deployment with max_inflight until the answer ends
    # The model's other deployments on the same channel, in the scheduler's order: where the call
    # spills when this deployment's own cluster bucket or queue refuses it (docs/routing.md, "Spill").
    peers: tuple[Deployment, ...] = ()
    spilled_from: tuple[str, ...] = ()  # the clusters that refused it, in order
    # The learning strategy chose `arm` (a cluster) with this probability (metered: route replay reads it).
    propensity: float | None = None
    # The group breakers open for deployments the call could have had (routed around them: a spill).
    routed_around: tuple[str, ...] = ()

    def spill(self) -> bool:
        """Move to the next peer deployment; False when none is left."""
        if not self.peers:
            return False
        self.spilled_from += (self.deployment.cluster,)
        self.deployment, self.peers = self.peers[0], self.peers[1:]
        return True

    def release_slot(self) -> None:
        if self.slot is not None:
            self.slot.release()

    def response_headers(self) -> list[tuple[str, str]]:
        out = [(CLUSTER_HEADER, self.deployment.cluster), (MODEL_HEADER, self.model.name),
               (CHANNEL_HEADER, self.channel)]
        if self.strategy:
            out.append((STRATEGY_HEADER, self.strategy))
        if self.arm:
            out.append((ARM_HEADER, self.arm))
        if self.spilled_from:
            out.append((SPILLED_FROM_HEADER, ",".join(self.spilled_from)))
        if self.slot is not None:
            out.append((QUEUE_WAIT_HEADER, f"{self.slot.waited_s * 1000:.1f}"))
        return out + self.ratelimit_headers
