"""The built-in detectors as tables: what each finds, what its check digits refuse; and fuzzed text
never crashes a check."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from contracts.config.guardrails import GuardCheck
from guardrails.checksums import iban_valid, luhn_valid
from guardrails.detectors import finder


def found(check_type: str, text: str, **kw: object) -> list[str]:
    find = finder(GuardCheck.model_validate({"type": check_type, **kw}))
    assert find is not None
    return [text[s:e] for s, e in find(text)]


@pytest.mark.parametrize(("digits", "ok"), [
    ("4111111111111111", True), ("4111111111111112", False), ("378282246310005", True),
    ("5555555555554444", True), ("0", False), ("79927398713", True), ("79927398710", False), ("12a4", False),
])
def test_luhn(digits: str, ok: bool) -> None:
    assert luhn_valid(digits) is ok


@pytest.mark.parametrize(("iban", "ok"), [
    ("DE89370400440532013000", True), ("DE89370400440532013001", False), ("GB82WEST12345698765432", True),
    ("GB82WEST12345698765431", False), ("FR1420041010050500013M02606", True), ("NL91ABNA0417164300", True),
    ("DE8937040044", False), ("1234567890123456", False), ("de89370400440532013000", False),
])
def test_iban_check_digits(iban: str, ok: bool) -> None:
    assert iban_valid(iban) is ok


@pytest.mark.parametrize(("kind", "text", "want"), [
    ("email", "write to ana.lopez+x@mail.example.com today", ["ana.lopez+x@mail.example.com"]),
    ("email", "no address here, a@b, @example.com", []),
    ("email", "unicode around: «bob@example.org» and Zoë", ["bob@example.org"]),
    ("email", "two: a@x.io,b@y.io", ["a@x.io", "b@y.io"]),
    ("card", "card 4111 1111 1111 1111 exp", ["4111 1111 1111 1111"]),
    ("card", "card 4111-1111-1111-1111.", ["4111-1111-1111-1111"]),
    ("card", "order 4111111111111112 is not a card", []),
    ("card", "amex 378282246310005", ["378282246310005"]),
    ("iban", "pay DE89 3704 0044 0532 0130 00 now", ["DE89 3704 0044 0532 0130 00"]),
    ("iban", "pay DE89370400440532013000 IN FULL", ["DE89370400440532013000"]),
    ("iban", "pay DE89370400440532013001", []),
    ("phone", "call +1 415 555 0100 or (030) 1234 5678", ["+1 415 555 0100", "(030) 1234 5678"]),
    ("phone", "version 1.2.3 and 2024-01", []),
    ("phone", "+4915112345678", ["+4915112345678"]),
    ("secret", "key sk-proj-abcdefghijklmnopqrstuvwx123 end", ["sk-proj-abcdefghijklmnopqrstuvwx123"]),
    ("secret", "aws AKIAIOSFODNN7EXAMPLE here", ["AKIAIOSFODNN7EXAMPLE"]),
    ("secret", "gh ghp_" + "a" * 36, ["ghp_" + "a" * 36]),
    ("secret", "jwt eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.dozjgNryP4J3jVmNHl0w5N_XgL0n3I9PlFUP0THsR8U x",
     ["eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.dozjgNryP4J3jVmNHl0w5N_XgL0n3I9PlFUP0THsR8U"]),
    ("secret", "-----BEGIN RSA PRIVATE KEY-----\nMIIB\nabc=\n-----END RSA PRIVATE KEY----- tail",
     ["-----BEGIN RSA PRIVATE KEY-----\nMIIB\nabc=\n-----END RSA PRIVATE KEY-----"]),
    ("secret", "cut short -----BEGIN PRIVATE KEY-----", ["-----BEGIN PRIVATE KEY-----"]),
    ("secret", "sk-short and a skeleton key", []),
])
def test_finds(kind: str, text: str, want: list[str]) -> None:
    assert found(kind, text) == want


def test_deny_words_on_word_boundaries_and_case() -> None:
    assert found("deny", "Project Falcon and falconry", words=["project falcon", "falcon"]) == ["Project Falcon"]
    assert found("deny", "FALCON", words=["falcon"], case_sensitive=True) == []


def test_regex() -> None:
    assert found("regex", "ticket ab-123 and AB-9", pattern=r"AB-\d+") == ["ab-123", "AB-9"]


@pytest.mark.parametrize("check", [
    {"type": "regex"}, {"type": "regex", "pattern": "("}, {"type": "regex", "pattern": "a*"},
    {"type": "deny", "words": [" "]}, {"type": "size"}, {"type": "size", "max_chars": 5, "action": "redact"},
    {"type": "email", "restore": True}, {"type": "email", "action": "redact", "direction": "output", "restore": True},
    {"type": "email", "pattern": "x"}, {"type": "email", "action": "warn"},
])
def test_bad_checks_are_refused(check: dict[str, object]) -> None:
    with pytest.raises(ValueError):
        GuardCheck.model_validate(check)


_ALL = [{"type": t} for t in ("email", "phone", "card", "iban", "secret")] + [
    {"type": "deny", "words": ["x y", "é"]}, {"type": "regex", "pattern": r"[a-z]+\d"}]


@settings(max_examples=150, deadline=None)
@given(st.text(alphabet=st.characters(codec="utf-8") | st.sampled_from("0123456789 -@.+[]()_ABCDEFGHIJ"),
               max_size=300))
def test_no_text_crashes_a_check(text: str) -> None:
    for spec in _ALL:
        find = finder(GuardCheck.model_validate(spec))
        assert find is not None
        for s, e in find(text):
            assert 0 <= s < e <= len(text)
