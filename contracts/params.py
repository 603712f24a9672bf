"""`drop_params`: what to do with a request control the chosen deployment's protocol cannot express.

The default (absent, or `false`) answers such a request 400, naming the control. `true` drops every
control the target lacks; a list drops only those named and still refuses the rest. A deployment's
setting wins over its model's. Names are the gateway's (OpenAI's spelling): a Gemini caller's
`generationConfig.topK` is `top_k` here.
"""

from __future__ import annotations

# The request controls some target protocols cannot express (adapters/controls.py says which).
DROPPABLE_PARAMS = ("top_k", "seed")

DropParams = bool | list[str] | None


def check_drop_params(v: DropParams) -> DropParams:
    """A name outside DROPPABLE_PARAMS would silently never match: refused at load instead."""
    if isinstance(v, list):
        unknown = [n for n in v if n not in DROPPABLE_PARAMS]
        if unknown:
            raise ValueError(f"drop_params: {', '.join(map(repr, unknown))} is not a droppable parameter "
                             f"(one of {', '.join(DROPPABLE_PARAMS)}, or true for all)")
    return v


def effective_drop_params(deployment: DropParams, model: DropParams) -> DropParams:
    """The deployment's setting where it has one, else its model's."""
    return deployment if deployment is not None else model
