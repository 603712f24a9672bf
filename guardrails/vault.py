"""One call's placeholders: the same value gets the same placeholder (`[EMAIL_1]`) for the whole call,
and those of `restore: true` checks are put back into the answer for the caller that sent them."""

from __future__ import annotations

import re

# What a placeholder looks like; the stream guard holds back an unclosed "[" no longer than this.
PLACEHOLDER = re.compile(r"\[[A-Z0-9_]{1,40}_\d{1,6}\]")
MAX_PLACEHOLDER = 50


def label_of(name: str) -> str:
    """A check's name as a placeholder label: `emails` -> `EMAILS`, `my-words` -> `MY_WORDS`."""
    label = re.sub(r"[^A-Za-z0-9]+", "_", name).strip("_").upper()[:32]
    return label or "REDACTED"


class Vault:
    __slots__ = ("_by_value", "_restorable", "_counts")

    def __init__(self) -> None:
        self._by_value: dict[tuple[str, str], str] = {}
        self._restorable: dict[str, str] = {}  # placeholder -> the original, for restore: true checks
        self._counts: dict[str, int] = {}

    def placeholder(self, label: str, value: str, *, restore: bool) -> str:
        key = (label, value)
        found = self._by_value.get(key)
        if found is None:
            n = self._counts.get(label, 0) + 1
            self._counts[label] = n
            found = self._by_value[key] = f"[{label}_{n}]"
        if restore:
            self._restorable[found] = value
        return found

    @property
    def restores(self) -> bool:
        return bool(self._restorable)

    def restorable(self) -> dict[str, str]:
        return dict(self._restorable)

    def restore(self, text: str) -> str:
        """`text` with every restorable placeholder of this call replaced by its original."""
        if not self._restorable or "[" not in text:
            return text
        table = self._restorable
        return PLACEHOLDER.sub(lambda m: table.get(m.group(), m.group()), text)
