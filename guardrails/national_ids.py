"""National identity numbers (the `national_id` check), pure: each format's shape, then its check
digits or structure rules, so a run of digits that merely looks like one is not taken.

    us_ssn      AAA-GG-SSSS (dashes or spaces): no area 000, 666 or 9xx, no group 00, no serial 0000
    uk_nino     AB 12 34 56 C: HMRC's allocated prefixes, suffix A-D
    de_steuer   11 digits: one digit repeated in the first ten, ISO 7064 MOD 11,10 check digit
    fr_nir      15 characters (Corsica 2A/2B): the key is 97 - (number mod 97)
    es_dni      8 digits and the letter of n mod 23; NIE: X/Y/Z, 7 digits, the same letter
    it_cf       codice fiscale: 16 characters (omocodia letters included), the check letter's odd/even tables
    nl_bsn      9 digits passing the 11-test (weights 9..2, -1)
    in_aadhaar  12 digits (4-4-4), no leading 0 or 1, the Verhoeff check digit
    br_cpf      11 digits (000.000.000-00), two mod-11 check digits, not all one digit

Patterns are linear and anchored on a non-alphanumeric neighbour on both sides.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable, Sequence

Span = tuple[int, int]

# No lookbehind at a pattern's start (it would stop the engine skipping ahead to a possible first
# character): a match glued to a letter or digit before it is dropped in `national_ids`.
_R = r"(?![A-Za-z0-9])"
_GLUED = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789")


def _digits(s: str) -> str:
    return "".join(c for c in s if "0" <= c <= "9")


def us_ssn_valid(s: str) -> bool:
    d = _digits(s)
    if len(d) != 9:
        return False
    area, group, serial = d[:3], d[3:5], d[5:]
    return area not in ("000", "666") and area[0] != "9" and group != "00" and serial != "0000"


_NINO_BAD_PREFIX = frozenset({"BG", "GB", "KN", "NK", "NT", "TN", "ZZ"})


def uk_nino_valid(s: str) -> bool:
    t = s.replace(" ", "").upper()
    if len(t) != 9 or not t[2:8].isdigit() or t[8] not in "ABCD":
        return False
    a, b = t[0], t[1]
    return (a.isalpha() and b.isalpha() and a not in "DFIQUV" and b not in "DFIOQUV"
            and t[:2] not in _NINO_BAD_PREFIX)


def de_steuer_valid(s: str) -> bool:
    d = _digits(s)
    if len(d) != 11 or d[0] == "0":
        return False
    counts = Counter(d[:10])
    repeated = [c for c in counts.values() if c > 1]
    if len(repeated) != 1 or repeated[0] > 3:
        return False
    product = 10
    for ch in d[:10]:
        total = (int(ch) + product) % 10 or 10
        product = (total * 2) % 11
    check = 11 - product
    return (0 if check == 10 else check) == int(d[10])


def fr_nir_valid(s: str) -> bool:
    t = s.replace(" ", "").upper()
    if len(t) != 15 or t[0] not in "12":
        return False
    body = t[:13]
    if body[5:7] == "2A":
        body = body[:5] + "19" + body[7:]
    elif body[5:7] == "2B":
        body = body[:5] + "18" + body[7:]
    if not body.isdigit() or not t[13:].isdigit():
        return False
    return 97 - int(body) % 97 == int(t[13:])


_DNI_LETTERS = "TRWAGMYFPDXBNJZSQVHLCKE"


def es_dni_valid(s: str) -> bool:
    t = s.replace("-", "").replace(" ", "").upper()
    if len(t) != 9:
        return False
    head = t[:8]
    if head[0] in "XYZ":
        head = str("XYZ".index(head[0])) + head[1:]
    return head.isdigit() and _DNI_LETTERS[int(head) % 23] == t[8]


_CF_ODD = dict(zip("0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZ",
                   (1, 0, 5, 7, 9, 13, 15, 17, 19, 21, 1, 0, 5, 7, 9, 13, 15, 17, 19, 21, 2, 4, 18, 20, 11, 3, 6, 8,
                    12, 14, 16, 10, 22, 25, 24, 23), strict=True))
_CF_EVEN = {**{str(i): i for i in range(10)}, **{chr(65 + i): i for i in range(26)}}


def it_cf_valid(s: str) -> bool:
    t = s.upper()
    if len(t) != 16 or not t.isascii() or not t.isalnum():
        return False
    total = sum((_CF_ODD if i % 2 == 0 else _CF_EVEN)[c] for i, c in enumerate(t[:15]))
    return chr(65 + total % 26) == t[15]


def nl_bsn_valid(s: str) -> bool:
    d = _digits(s)
    if len(d) != 9 or d == "000000000":
        return False
    total = sum(int(c) * w for c, w in zip(d, (9, 8, 7, 6, 5, 4, 3, 2, -1), strict=True))
    return total % 11 == 0


_VERHOEFF_D = (
    (0, 1, 2, 3, 4, 5, 6, 7, 8, 9), (1, 2, 3, 4, 0, 6, 7, 8, 9, 5), (2, 3, 4, 0, 1, 7, 8, 9, 5, 6),
    (3, 4, 0, 1, 2, 8, 9, 5, 6, 7), (4, 0, 1, 2, 3, 9, 5, 6, 7, 8), (5, 9, 8, 7, 6, 0, 4, 3, 2, 1),
    (6, 5, 9, 8, 7, 1, 0, 4, 3, 2), (7, 6, 5, 9, 8, 2, 1, 0, 4, 3), (8, 7, 6, 5, 9, 3, 2, 1, 0, 4),
    (9, 8, 7, 6, 5, 4, 3, 2, 1, 0))
_VERHOEFF_P = (
    (0, 1, 2, 3, 4, 5, 6, 7, 8, 9), (1, 5, 7, 6, 2, 8, 3, 0, 9, 4), (5, 8, 0, 3, 7, 9, 6, 1, 4, 2),
    (8, 9, 1, 6, 0, 4, 3, 5, 2, 7), (9, 4, 5, 3, 1, 2, 6, 8, 7, 0), (4, 2, 8, 6, 5, 7, 3, 9, 0, 1),
    (2, 7, 9, 3, 8, 0, 6, 4, 1, 5), (7, 0, 4, 6, 9, 1, 3, 2, 5, 8))


def verhoeff_valid(digits: str) -> bool:
    c = 0
    for i, ch in enumerate(reversed(digits)):
        c = _VERHOEFF_D[c][_VERHOEFF_P[i % 8][ord(ch) - 48]]
    return c == 0 and bool(digits)


def in_aadhaar_valid(s: str) -> bool:
    d = _digits(s)
    return len(d) == 12 and d[0] not in "01" and verhoeff_valid(d)


def br_cpf_valid(s: str) -> bool:
    d = _digits(s)
    if len(d) != 11 or len(set(d)) == 1:
        return False
    nums = [int(c) for c in d]
    for n in (9, 10):
        check = sum(v * w for v, w in zip(nums[:n], range(n + 1, 1, -1), strict=True)) * 10 % 11 % 10
        if check != nums[n]:
            return False
    return True


_DIGIT = re.compile(r"[0-9]")
_CF_DIGIT = "[0-9LMNPQRSTUV]"  # omocodia: a digit may be replaced by a letter when two codes collide
FORMATS: dict[str, tuple[re.Pattern[str], Callable[[str], bool]]] = {
    "us_ssn": (re.compile(r"\d{3}([- ])\d{2}\1\d{4}" + _R), us_ssn_valid),
    "uk_nino": (re.compile(r"[A-Za-z]{2} ?\d{2} ?\d{2} ?\d{2} ?[A-Da-d]" + _R), uk_nino_valid),
    "de_steuer": (re.compile(r"[1-9]\d(?: ?\d{3}){3}" + _R), de_steuer_valid),
    "fr_nir": (re.compile(r"[12] ?\d{2} ?\d{2} ?(?:\d{2}|2[ABab]) ?\d{3} ?\d{3} ?\d{2}" + _R), fr_nir_valid),
    "es_dni": (re.compile(r"(?:\d{8}|[XYZxyz]-?\d{7})-?[A-Za-z]" + _R), es_dni_valid),
    "it_cf": (re.compile(r"[A-Za-z]{6}" + _CF_DIGIT + "{2}[ABCDEHLMPRSTabcdehlmprst]" + _CF_DIGIT
                         + r"{2}[A-Za-z]" + _CF_DIGIT + r"{3}[A-Za-z]" + _R), it_cf_valid),
    "nl_bsn": (re.compile(r"\d{4}\.?\d{2}\.?\d{3}" + _R), nl_bsn_valid),
    "in_aadhaar": (re.compile(r"[2-9]\d{3}([ -]?)\d{4}\1\d{4}" + _R), in_aadhaar_valid),
    "br_cpf": (re.compile(r"\d{3}\.?\d{3}\.?\d{3}-?\d{2}" + _R), br_cpf_valid),
}
# A cheaper search that any match of a format must contain, starting with a digit class (so the
# engine skips ahead): a text without it is not scanned with the full pattern. Formats that start
# with letters would otherwise try a match at every letter.
_GATES: dict[str, re.Pattern[str]] = {
    "uk_nino": re.compile(r"\d{2} ?\d{2} ?\d{2} ?[A-Da-d]"),
    "es_dni": re.compile(r"\d{7}-?[A-Za-z]"),
    "it_cf": re.compile(r"[0-9LMNPQRSTUV]{2}[ABCDEHLMPRSTabcdehlmprst][0-9LMNPQRSTUV]{2}[A-Za-z]"),
}


def national_ids(formats: Sequence[str]) -> Callable[[str], list[Span]]:
    """A finder of the listed formats (all of them when empty); overlaps are left to the scan."""
    chosen = [(*FORMATS[f], _GATES.get(f)) for f in (formats or FORMATS)]

    def find(text: str) -> list[Span]:
        # Every format holds 6 digits or more (a codice fiscale 7, omocodia aside): ten C scans decide
        # most texts before any pattern runs.
        if _DIGIT.search(text) is None or sum(map(text.count, "0123456789")) < 6:
            return []
        spans = [m.span() for pattern, valid, gate in chosen if gate is None or gate.search(text) is not None
                 for m in pattern.finditer(text) if not (m.start() and text[m.start() - 1] in _GLUED) and valid(m.group())]
        return sorted(spans) if len(spans) > 1 else spans
    return find
