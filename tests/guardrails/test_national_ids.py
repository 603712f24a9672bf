"""National id formats as tables (valid numbers found, a wrong check digit refused) and fuzzed text
never crashes the finder; language limits with py3langid."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from contracts.config.guardrails import GuardCheck
from guardrails import national_ids as ni
from guardrails.detectors import finder
from guardrails.language import detect


def found(text: str, **kw: object) -> list[str]:
    find = finder(GuardCheck.model_validate({"type": "national_id", **kw}))
    assert find is not None
    return [text[s:e] for s, e in find(text)]


@pytest.mark.parametrize(("fmt", "good", "bad"), [
    ("us_ssn", "123-45-6789", "666-45-6789"),
    ("us_ssn", "078 05 1120", "123-00-6789"),
    ("uk_nino", "AB 12 34 56 C", "QQ 12 34 56 C"),
    ("uk_nino", "JG103759A", "GB103759A"),
    ("de_steuer", "86095742719", "86095742718"),
    ("de_steuer", "47036892816", "11111111111"),
    ("fr_nir", "1 84 12 76 451 089 46", "1 84 12 76 451 089 47"),
    ("fr_nir", "2 69 05 2A 123 456 88", "2 69 05 2A 123 456 89"),
    ("es_dni", "12345678Z", "12345678A"),
    ("es_dni", "X1234567L", "X1234567A"),
    ("it_cf", "RSSMRA85T10A562S", "RSSMRA85T10A562T"),
    ("nl_bsn", "111222333", "111222334"),
    ("in_aadhaar", "2341 2341 2346", "2341 2341 2345"),
    ("br_cpf", "529.982.247-25", "529.982.247-24"),
])
def test_each_format_and_its_check_digits(fmt: str, good: str, bad: str) -> None:
    assert found(f"id: {good}.", formats=[fmt]) == [good]
    assert found(f"id: {bad}.", formats=[fmt]) == []
    assert found(f"x{good}x", formats=[fmt]) == []  # glued to letters: no id


def test_all_formats_by_default_and_the_formats_are_checked() -> None:
    text = "ssn 123-45-6789, cpf 529.982.247-25 and a CF RSSMRA85T10A562S"
    assert found(text) == ["123-45-6789", "529.982.247-25", "RSSMRA85T10A562S"]
    assert found("no digits here at all") == []
    with pytest.raises(ValueError):
        GuardCheck.model_validate({"type": "national_id", "formats": ["xx_id"]})
    with pytest.raises(ValueError):
        GuardCheck.model_validate({"type": "email", "formats": ["us_ssn"]})


def test_the_fr_nir_key_and_corsica() -> None:
    # 2A counts as 19, 2B as 18 before mod 97
    for dept, value in (("2A", "19"), ("2B", "18")):
        key = 97 - int(f"26905{value}123456") % 97
        assert ni.fr_nir_valid(f"26905{dept}123456{key:02d}")
        assert not ni.fr_nir_valid(f"26905{dept}123456{(key + 1) % 100:02d}")


def test_verhoeff_catches_every_single_digit_error() -> None:
    good = "234123412346"
    assert ni.verhoeff_valid(good)
    for i in range(len(good)):
        for d in "0123456789":
            if d != good[i]:
                assert not ni.verhoeff_valid(good[:i] + d + good[i + 1:])


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet=st.characters(codec="utf-8") | st.sampled_from("0123456789 -.XYZABCD"), max_size=300))
def test_fuzzed_text_never_crashes_and_spans_are_in_range(text: str) -> None:
    find = ni.national_ids([])
    for s, e in find(text):
        assert 0 <= s < e <= len(text)


@settings(max_examples=200, deadline=None)
@given(st.text(alphabet="0123456789 .-", min_size=9, max_size=40))
def test_fuzzed_digit_runs_only_valid_ids(text: str) -> None:
    for s, e in ni.national_ids([])(text):
        value = text[s:e]
        assert any(valid(value) for pattern, valid in ni.FORMATS.values() if pattern.fullmatch(value))


@pytest.mark.parametrize(("text", "lang"), [
    ("Could you please book a table for two people tonight at the Italian place?", "en"),
    ("Ich möchte heute Abend einen Tisch für zwei Personen reservieren, bitte.", "de"),
    ("Je voudrais réserver une table pour deux personnes ce soir, s'il vous plaît.", "fr"),
    ("Пожалуйста, забронируйте столик на двоих сегодня вечером в ресторане.", "ru"),
])
def test_language_detection(text: str, lang: str) -> None:
    assert detect(text)[0] == lang


def test_language_limit() -> None:
    find = finder(GuardCheck.model_validate({"type": "language", "languages": ["en", "de"], "min_chars": 20}))
    assert find is not None
    ru = "Пожалуйста, забронируйте столик на двоих сегодня вечером в ресторане."
    assert find(ru) == [(0, len(ru))]
    assert find("Ich möchte heute Abend einen Tisch für zwei Personen reservieren.") == []
    assert find("Привет") == []  # too short to tell: passes
    for bad in ({"type": "language"}, {"type": "language", "languages": ["english"]},
                {"type": "language", "languages": ["en"], "action": "redact"}):
        with pytest.raises(ValueError):
            GuardCheck.model_validate(bad)


@settings(max_examples=100, deadline=None)
@given(st.text(max_size=500))
def test_fuzzed_language_never_crashes(text: str) -> None:
    find = finder(GuardCheck.model_validate({"type": "language", "languages": ["en"], "min_chars": 1}))
    assert find is not None
    assert find(text) in ([], [(0, len(text))])
