"""The `language` check, pure: which language a text is in, told by py3langid (a naive Bayes model
over byte n-grams that ships in the wheel; nothing is fetched at run time), against those allowed.

The model loads once per process (about 0.5 s), when the first policy with a language check is
compiled, not on a request."""

from __future__ import annotations

import functools
import re
from collections.abc import Callable
from typing import Any

Span = tuple[int, int]
# Below this confidence the text is no clear case of any language (numbers, code, names): it passes.
MIN_CONFIDENCE = 0.5
# The model reads bytes: a text longer than this is judged on its head (enough to tell; bounded cost).
MAX_CHARS = 4096
# Placeholders of this call's redactions ([EMAIL_1]) are no language.
_PLACEHOLDERS = re.compile(r"\[[A-Z0-9_]{1,40}_\d{1,6}\]")


@functools.cache
def _identifier() -> Any:
    from py3langid.langid import MODEL_FILE, LanguageIdentifier  # type: ignore[import-untyped]

    return LanguageIdentifier.from_model_file(MODEL_FILE, norm_probs=True)


def detect(text: str) -> tuple[str, float]:
    """(ISO 639-1 code, probability) of the language `text` is most likely in."""
    lang, p = _identifier().classify(text[:MAX_CHARS])
    return str(lang), float(p)


def language_limit(allowed: list[str], min_chars: int) -> Callable[[str], list[Span]]:
    """A finder: the whole text when it is clearly in a language not `allowed`, else nothing."""
    ok = frozenset(allowed)
    _identifier()  # loaded with the policy, off the request path

    def find(text: str) -> list[Span]:
        plain = _PLACEHOLDERS.sub(" ", text) if "[" in text else text
        if len(plain.strip()) < min_chars:
            return []
        lang, p = detect(plain)
        return [(0, len(text))] if lang not in ok and p >= MIN_CONFIDENCE else []
    return find
