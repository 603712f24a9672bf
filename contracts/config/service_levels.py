"""Service levels: a tenant's tier and a deployment's channel, the two axes of fast admission."""

from typing import Literal

Tier = Literal["L1", "L2", "L3"]
Channel = Literal["standard", "fast"]
