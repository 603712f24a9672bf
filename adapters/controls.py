"""Request controls a target protocol may be unable to express, and what the operator's
`drop_params` policy (contracts/params.py) makes of them.

Each chat protocol module reports the controls set on a request that it cannot render
(`unsupported_controls`); `decide` splits them into dropped and refused, refusing with a 400 that
names each in the caller's own spelling; `without` clears the dropped ones. Pure: no I/O, no config.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable

from adapters.internal import ChatRequest
from contracts.errors import ClientError
from contracts.params import DROPPABLE_PARAMS, DropParams

__all__ = ["DROPPABLE_PARAMS", "set_controls", "lacking", "decide", "without", "refuse", "client_spelling"]

# How each client protocol spells a control, where it differs from the gateway's name.
_SPELLING = {
    "gemini": {"top_k": "generationConfig.topK", "seed": "generationConfig.seed"},
}


# Protocol names as their providers write them, for messages.
_TARGETS = {"openai": "OpenAI", "anthropic": "Anthropic", "gemini": "Gemini", "responses": "Responses API",
            "completions": "Completions API",
            "azure-openai": "Azure OpenAI", "bedrock": "Bedrock", "vertex": "Vertex AI"}


def set_controls(req: ChatRequest) -> tuple[str, ...]:
    """The droppable controls the request sets."""
    return tuple(n for n in DROPPABLE_PARAMS if getattr(req, n) is not None)


def lacking(req: ChatRequest, supported: frozenset[str]) -> tuple[str, ...]:
    """The controls `req` sets that a target supporting only `supported` cannot express."""
    return tuple(n for n in set_controls(req) if n not in supported)


def client_spelling(name: str, client: str) -> str:
    return _SPELLING.get(client, {}).get(name, name)


def refuse(names: Iterable[str], target: str, client: str = "openai") -> None:
    """The 400 for controls the `target` protocol cannot express, named as the caller spelled them."""
    names = tuple(names)
    if not names:
        return
    spelled = ", ".join(client_spelling(n, client) for n in names)
    verb = "is" if len(names) == 1 else "are"
    raise ClientError(f"{spelled} {verb} not supported by this model's {_TARGETS.get(target, target)} deployment "
                      "(a gateway operator may set drop_params to drop it instead)")


def decide(names: tuple[str, ...], policy: DropParams, *, target: str, client: str) -> tuple[str, ...]:
    """The controls to drop under `policy`; a control it does not cover is refused (400)."""
    if not names:
        return ()
    if policy is True:
        return names
    allowed = policy if isinstance(policy, list) else ()
    refuse([n for n in names if n not in allowed], target, client)
    return names


def without(req: ChatRequest, names: Iterable[str]) -> ChatRequest:
    """`req` with the named controls unset."""
    names = frozenset(names)
    return dataclasses.replace(req, top_k=None if "top_k" in names else req.top_k,
                               seed=None if "seed" in names else req.seed)
