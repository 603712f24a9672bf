"""A Llama-Guard-style safety classifier the demo LLM upstreams answer as, for the `classify`
guardrail (docs/guardrails.md): a request for a model named `llama-guard*` (the deployment's
`upstream_model`) gets `safe`, or `unsafe` and the violated categories on the next line (Llama Guard
3's S-codes), from a few trigger words per category in the last user message. Deterministic; a demo,
not a safety model.
"""

from __future__ import annotations

import re

MODEL_PREFIX = "llama-guard"  # the upstream model names answered this way
# Llama Guard 3's hazard codes, a few trigger words each (whole words, any case).
TRIGGERS: dict[str, tuple[str, ...]] = {
    "S1": ("assault", "kidnap", "murder"),  # violent crimes
    "S2": ("counterfeit", "launder", "shoplift"),  # non-violent crimes
    "S9": ("nerve agent", "pipe bomb", "anthrax"),  # indiscriminate weapons
    "S11": ("hurt myself",),  # suicide and self-harm
}
_PATTERNS = {code: re.compile(r"\b(?:" + "|".join(map(re.escape, words)) + r")\b", re.IGNORECASE)
             for code, words in TRIGGERS.items()}


def is_classifier(model: str) -> bool:
    return model.lower().startswith(MODEL_PREFIX)


def verdict(text: str) -> str:
    """`safe`, or `unsafe\\nS1,S9` (the categories in Llama Guard's order)."""
    codes = [code for code, pattern in _PATTERNS.items() if pattern.search(text)]
    return "unsafe\n" + ",".join(codes) if codes else "safe"
