"""The PII redactor for a traced application: `traced_agent(redactor=redact_pii)` redacts before anything is exported.

The redactor is the consumer's (tracejudge's shared base); it needs `phonenumbers`, from the `redact` extra
(`pip install phonenumbers`, or the clone's `[redact]`), so a plain `import tracejudge.tracer` never loads it: only
this module does.
"""

from __future__ import annotations

try:
    from tracejudge._shared.redact import DEFAULT_REGIONS, PHONE_BUDGET_CHARS, PiiRedactor, Redactor, redact_pii
except ModuleNotFoundError as error:
    if error.name != "phonenumbers":
        raise
    raise ImportError(
        "tracejudge.tracer.redact needs phonenumbers (the redact extra): pip install phonenumbers", name=__name__
    ) from None

__all__ = ["DEFAULT_REGIONS", "PHONE_BUDGET_CHARS", "PiiRedactor", "Redactor", "redact_pii"]
