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
from guardrails.language import language_limit
from guardrails.national_ids import national_ids

Span = tuple[int, int]
Finder = Callable[[str], list[Span]]

# Each pattern starts with a character class (no lookbehind), so the engine skips ahead to where a match
# may start; what the character before it must not be is checked in `_scan` (several times faster).
_EMAIL_DOMAIN = re.compile(r"[A-Za-z0-9-]{1,63}(?:\.[A-Za-z0-9-]{1,63})*\.[A-Za-z]{2,24}(?![A-Za-z0-9-])")
_EMAIL_LOCAL = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._%+-")
# 7 to 15 digits (E.164's most), optionally +country, groups split by one space, dot or dash, an
# area code in parentheses; digits glued to letters or other digits are no phone number.
_PHONE = re.compile(r"[+(\d](?:(?<=\+)\d{6,14}(?!\w)|(?:(?<=\+)\d{1,3}[ .-]?(?:\(\d{1,4}\)[ .-]?)?"
                    r"|(?<=\()\d{1,4}\)[ .-]?|)\d{1,5}(?:[ .-]\d{2,5}){1,4}(?!\w))")
_CARD = re.compile(r"\d(?:[ -]?\d){12,18}(?!\d)")
_IBAN = re.compile(r"[A-Z]{2}\d{2}(?: ?[A-Z0-9]{1,4}){3,8}(?![A-Za-z0-9])")
# Each provider's format behind the literal it starts with: `literal in text` (a C scan) skips the
# regex for the formats a text cannot hold, the common case.
_SECRETS = tuple((lit, re.compile(pat)) for lit, pat in (
    ("sk-", r"\bsk-(?:proj-|svcacct-|admin-|ant-(?:api|admin)\d\d-)?[A-Za-z0-9_-]{20,}"),  # OpenAI, Anthropic
    ("AKIA", r"\bAKIA[0-9A-Z]{16}\b"), ("ASIA", r"\bASIA[0-9A-Z]{16}\b"),  # AWS access key ids
    ("gh", r"\bgh[pousr]_[A-Za-z0-9]{36,}\b"), ("github_pat_", r"\bgithub_pat_[A-Za-z0-9_]{22,}"),  # GitHub
    ("AIza", r"\bAIza[0-9A-Za-z_-]{35}"),  # Google API keys
    ("xox", r"\bxox[abposr]-[A-Za-z0-9-]{10,}"),  # Slack
    ("k_", r"\b[rs]k_(?:live|test)_[A-Za-z0-9]{16,}"),  # Stripe
    ("hf_", r"\bhf_[A-Za-z0-9]{30,}"),  # Hugging Face
    ("eyJ", r"\beyJ[A-Za-z0-9_-]{8,}\.eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}"),  # JWTs (header and claims are JSON)
    # A private key block: the header alone is enough to know; the body and footer go with it when present.
    ("-----BEGIN ", r"-----BEGIN (?:[A-Z0-9]+ ){0,3}PRIVATE KEY-----(?:[A-Za-z0-9+/=\s:,-]{0,8192}?"
                    r"-----END (?:[A-Z0-9]+ ){0,3}PRIVATE KEY-----)?"),
))


def _spans(pattern: re.Pattern[str]) -> Finder:
    def find(text: str) -> list[Span]:
        return [m.span() for m in pattern.finditer(text)]
    return find


def _scan(pattern: re.Pattern[str], text: str, glued: Callable[[str], bool]) -> list[re.Match[str]]:
    """Matches of `pattern` not glued to the character before them; after a glued one the search
    goes on from the next character (a match may start inside it)."""
    out, pos = [], 0
    while (m := pattern.search(text, pos)) is not None:
        s = m.start()
        if s and glued(text[s - 1]):
            pos = s + 1
            continue
        out.append(m)
        pos = m.end()
    return out


def _word_char(c: str) -> bool:
    return c.isalnum() or c == "_"


def _secrets(text: str) -> list[Span]:
    spans = [m.span() for lit, pattern in _SECRETS if lit in text for m in pattern.finditer(text)]
    return sorted(spans) if len(spans) > 1 else spans


def _emails(text: str) -> list[Span]:
    """From each "@": the local part walked back (at most 64 characters), the domain matched after."""
    out: list[Span] = []
    at = text.find("@")
    while at != -1:
        start = at
        while start > 0 and at - start < 64 and text[start - 1] in _EMAIL_LOCAL:
            start -= 1
        if start < at and (start == 0 or text[start - 1] not in _EMAIL_LOCAL) and (not out or start >= out[-1][1]):
            m = _EMAIL_DOMAIN.match(text, at + 1)
            if m is not None:
                out.append((start, m.end()))
        at = text.find("@", at + 1)
    return out


def _deny(words: list[str], pattern: re.Pattern[str], case_sensitive: bool) -> Finder:
    """A deny-list: the regex runs only when some word is in the text (`in` is a C scan)."""
    folded = words if case_sensitive else [w.lower() for w in words]

    def find(text: str) -> list[Span]:
        hay = text if case_sensitive else text.lower()
        if not any(w in hay for w in folded):
            return []
        return [m.span() for m in pattern.finditer(text)]
    return find


def _digits_in(text: str, min_digits: int, max_digits: int) -> bool:
    n = sum(c.isdigit() for c in text)
    return min_digits <= n <= max_digits


def _phones(text: str) -> list[Span]:
    return [m.span() for m in _scan(_PHONE, text, lambda c: _word_char(c) or c == "+")
            if _digits_in(m.group(), 7, 15)]


def _cards(text: str) -> list[Span]:
    out = []
    for m in _scan(_CARD, text, lambda c: c.isdigit() or c == "-"):
        digits = m.group().replace(" ", "").replace("-", "")
        if 13 <= len(digits) <= 19 and luhn_valid(digits):
            out.append(m.span())
    return out


def _ibans(text: str) -> list[Span]:
    """The longest prefix of each candidate (whole groups of four) whose check digits hold: the
    pattern may run on into a following code word."""
    out = []
    for m in _scan(_IBAN, text, str.isalnum):
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
    """The finder of a check type; None for the size and webhook checks (a limit, a call: no spans)."""
    flags = 0 if check.case_sensitive else re.IGNORECASE
    match check.type:
        case "email":
            return _emails
        case "phone":
            return _phones
        case "card":
            return _cards
        case "iban":
            return _ibans
        case "secret":
            return _secrets
        case "regex":
            assert check.pattern is not None  # the config model requires it
            return _spans(re.compile(check.pattern, flags))
        case "deny":
            words = sorted({w.strip() for w in check.words if w.strip()}, key=len, reverse=True)
            return _deny(words, re.compile(r"(?<!\w)(?:" + "|".join(map(re.escape, words)) + r")(?!\w)", flags),
                         check.case_sensitive)
        case "national_id":
            return national_ids(check.formats)
        case "language":
            return language_limit(check.languages, check.min_chars)
        case "size" | "webhook" | "json_schema" | "moderation" | "classify":
            return None
