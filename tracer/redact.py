"""Redaction before content leaves for the judge: e-mails, phone numbers, Luhn-valid cards, IBANs, API keys."""

from __future__ import annotations

import re
from collections.abc import Callable

Redactor = Callable[[str], str]

_EMAIL = re.compile(r"[A-Za-z0-9._%+-]+@[A-Za-z0-9.-]+\.[A-Za-z]{2,}")
_CARD = re.compile(r"\b(?:\d[ -]?){12,18}\d\b")
_IBAN = re.compile(r"\b[A-Z]{2}\d{2}(?: ?[A-Z0-9]){11,30}\b")
_API_KEY = re.compile(
    r"\b(?:sk|pk|rk|ghp|gho|ghs|glpat|AKIA|AIza|xox[abpr])[-_A-Za-z0-9]{16,}"
    r"|\b(?=[A-Za-z0-9_-]*\d)(?=[A-Za-z0-9_-]*[A-Za-z])[A-Za-z0-9_-]{32,}\b"
)
_PHONE = re.compile(r"(?<![\w+])\+?\d[\d ().-]{7,}\d(?!\w)")


def _luhn_ok(digits: str) -> bool:
    total = 0
    for position, char in enumerate(reversed(digits)):
        value = int(char)
        if position % 2 == 1:
            value *= 2
            if value > 9:
                value -= 9
        total += value
    return total % 10 == 0


def _card(match: re.Match[str]) -> str:
    digits = re.sub(r"\D", "", match.group(0))
    return "[CARD]" if 13 <= len(digits) <= 19 and _luhn_ok(digits) else match.group(0)


def _phone(match: re.Match[str]) -> str:
    digits = re.sub(r"\D", "", match.group(0))
    return "[PHONE]" if 8 <= len(digits) <= 15 else match.group(0)


def redact_pii(text: str) -> str:
    """The default redactor. Cards before phones (both are digit runs); keys before IBANs."""
    text = _EMAIL.sub("[EMAIL]", text)
    text = _API_KEY.sub("[API_KEY]", text)
    text = _IBAN.sub("[IBAN]", text)
    text = _CARD.sub(_card, text)
    return _PHONE.sub(_phone, text)
