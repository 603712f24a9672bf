"""Check digits that tell a card number or an IBAN from any run of digits (pure)."""

from __future__ import annotations


def luhn_valid(digits: str) -> bool:
    """The Luhn mod-10 check every payment card number passes; `digits`: ASCII digits only."""
    total = 0
    for i, ch in enumerate(reversed(digits)):
        d = ord(ch) - 48
        if not 0 <= d <= 9:
            return False
        if i % 2:
            d = d * 2 - 9 if d > 4 else d * 2
        total += d
    return total % 10 == 0 and len(digits) > 1


def iban_valid(iban: str) -> bool:
    """ISO 13616 mod-97: the country and check digits moved to the end, letters as 10..35, == 1."""
    if not 15 <= len(iban) <= 34 or not iban[:2].isascii() or not iban[:2].isalpha() or not iban[2:4].isdigit():
        return False
    remainder = 0
    for ch in iban[4:] + iban[:4]:
        if "0" <= ch <= "9":
            remainder = (remainder * 10 + ord(ch) - 48) % 97
        elif "A" <= ch <= "Z":
            remainder = (remainder * 100 + ord(ch) - 55) % 97
        else:
            return False
    return remainder == 1
