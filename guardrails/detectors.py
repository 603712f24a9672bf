"""What each check type finds in a text: spans (start, end), pure and bounded.

Patterns are ASCII-classed and linear (no nested quantifiers over the same characters), so a long or
hostile text costs time proportional to its length; checksummed types (cards, IBANs) drop the digit
runs whose check digits fail.
"""

from __future__ import annotations

import re
from collections.abc import Callable

from contracts.config.guardrails import GuardCheck
from guardrails.checksums import iban_valid, luhn_valid

Span = tuple[int, int]
Finder = Callable[[str], list[Span]]

_EMAIL = re.compile(r"(?<![A-Za-z0-9._%+-])[A-Za-z0-9._%+-]{1,64}@[A-Za-z0-9-]{1,63}(?:\.[A-Za-z0-9-]{1,63})*"
                    r"\.[A-Za-z]{2,24}(?![A-Za-z0-9-])")
# 7 to 15 digits (E.164's most), optionally +country, groups split by one space, dot or dash, an
# area code in parentheses; digits glued to letters or other digits are no phone number.
_PHONE = re.compile(r"(?<![\w+])(?:\+\d{1,3}[ .-]?)?(?:\(\d{1,4}\)[ .-]?)?\d{2,5}(?:[ .-]\d{2,5}){1,4}(?![\w])"
                    r"|(?<![\w+])\+\d{7,15}(?!\w)")
_CARD = re.compile(r"(?<![\d-])\d(?:[ -]?\d){12,18}(?![\d])")
_IBAN = re.compile(r"(?<![A-Za-z0-9])[A-Z]{2}\d{2}(?: ?[A-Z0-9]{1,4}){3,8}(?![A-Za-z0-9])")
_SECRET = re.compile("|".join((
    r"\bsk-(?:proj-|svcacct-|admin-|ant-(?:api|admin)\d\d-)?[A-Za-z0-9_-]{20,}",  # OpenAI, Anthropic
    r"\b(?:AKIA|ASIA)[0-9A-Z]{16}\b",  # AWS access key ids
    r"\bgh[pousr]_[A-Za-z0-9]{36,}\b", r"\bgithub_pat_[A-Za-z0-9_]{22,}",  # GitHub
    r"\bAIza[0-9A-Za-z_-]{35}",  # Google API keys
    r"\bxox[abposr]-[A-Za-z0-9-]{10,}",  # Slack
    r"\b[rs]k_(?:live|test)_[A-Za-z0-9]{16,}",  # Stripe
    r"\bhf_[A-Za-z0-9]{30,}",  # Hugging Face
    r"\beyJ[A-Za-z0-9_-]{8,}\.eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}",  # JWTs (header and claims are JSON)
    # A private key block: the header alone is enough to know; the body and footer go with it when present.
    r"-----BEGIN (?:[A-Z0-9]+ ){0,3}PRIVATE KEY-----(?:[A-Za-z0-9+/=\s:,-]{0,8192}?"
    r"-----END (?:[A-Z0-9]+ ){0,3}PRIVATE KEY-----)?",
)))


def _spans(pattern: re.Pattern[str]) -> Finder:
    def find(text: str) -> list[Span]:
        return [m.span() for m in pattern.finditer(text)]
    return find


def _digits_in(text: str, min_digits: int, max_digits: int) -> bool:
    n = sum(c.isdigit() for c in text)
    return min_digits <= n <= max_digits


def _phones(text: str) -> list[Span]:
    return [m.span() for m in _PHONE.finditer(text) if _digits_in(m.group(), 7, 15)]


def _cards(text: str) -> list[Span]:
    out = []
    for m in _CARD.finditer(text):
        digits = m.group().replace(" ", "").replace("-", "")
        if 13 <= len(digits) <= 19 and luhn_valid(digits):
            out.append(m.span())
    return out


def _ibans(text: str) -> list[Span]:
    """The longest prefix of each candidate (whole groups of four) whose check digits hold: the
    pattern may run on into a following code word."""
    out = []
    for m in _IBAN.finditer(text):
        raw, start = m.group(), m.start()
        end = len(raw)
        while end >= 15:
            candidate = raw[:end].replace(" ", "")
            if iban_valid(candidate):
                out.append((start, start + end))
                break
            cut = raw.rfind(" ", 0, end)
            end = cut if cut > 0 and end - cut <= 5 else end - 1
    return out


def finder(check: GuardCheck) -> Finder | None:
    """The finder of a check type; None for the size check (a limit, not a span)."""
    flags = 0 if check.case_sensitive else re.IGNORECASE
    match check.type:
        case "email":
            return _spans(_EMAIL)
        case "phone":
            return _phones
        case "card":
            return _cards
        case "iban":
            return _ibans
        case "secret":
            return _spans(_SECRET)
        case "regex":
            assert check.pattern is not None  # the config model requires it
            return _spans(re.compile(check.pattern, flags))
        case "deny":
            words = sorted({w.strip() for w in check.words if w.strip()}, key=len, reverse=True)
            return _spans(re.compile(r"(?<!\w)(?:" + "|".join(map(re.escape, words)) + r")(?!\w)", flags))
        case "size":
            return None
