"""How the verdict is asked for (structured output, JSON mode or plain text) and which of these each model accepts,
learnt per process from the provider's first rejection. Its own module because the learning is shared state: every
backend instance for a model string, on any thread or event loop, reads and updates the one `RESPONSE_MODES`.
"""

from __future__ import annotations

import asyncio
import re
import threading
import time

from ._errors import JudgeCallError
from ._results import ERROR_BAD_REQUEST

# How the verdict is asked for, best first: structured output bound to the labels, JSON mode, plain text.
MODE_JSON_SCHEMA = "json_schema"
MODE_JSON_OBJECT = "json_object"
MODE_TEXT = "text"
RESPONSE_MODES_ORDER = (MODE_JSON_SCHEMA, MODE_JSON_OBJECT, MODE_TEXT)
_FORMAT_WORDS = re.compile(r"response_format|json_schema|json_object|structured output|response_schema", re.IGNORECASE)


def rejects_response_format(exc: BaseException, error: JudgeCallError) -> bool:
    """A 4xx that names the response format, or LiteLLM's UnsupportedParamsError: the model cannot do this mode."""
    if type(exc).__name__ == "UnsupportedParamsError":
        return True
    return error.kind == ERROR_BAD_REQUEST and bool(_FORMAT_WORDS.search(str(exc)))


class ResponseModes:
    """Per process and model string: which response mode works, learnt from the first rejection.

    While a model's mode is unproven only one call probes it and the others wait (any thread, any event loop), so
    a model that rejects the schema costs one rejected call per process, not one per judgement."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._learnt: dict[str, str] = {}
        self._next: dict[str, str] = {}
        self._probing: set[str] = set()

    def mode(self, model: str) -> str | None:
        with self._lock:
            return self._learnt.get(model)

    def candidate(self, model: str) -> str:
        """The mode to try now: the learnt one, else the next one down after the rejections so far."""
        with self._lock:
            return self._learnt.get(model) or self._next.get(model, MODE_JSON_SCHEMA)

    async def acquire(self, model: str, *, wait_s: float | None = None) -> tuple[str, bool]:
        """The mode to use and whether this caller is the prober (it must call `release`). After `wait_s` of
        waiting for another prober, the current candidate without probing (None: wait as long as it takes)."""
        deadline = None if wait_s is None else time.monotonic() + wait_s
        while True:
            with self._lock:
                learnt = self._learnt.get(model)
                if learnt is not None:
                    return learnt, False
                if model not in self._probing:
                    self._probing.add(model)
                    return self._next.get(model, MODE_JSON_SCHEMA), True
                if deadline is not None and time.monotonic() >= deadline:
                    return self._next.get(model, MODE_JSON_SCHEMA), False
            await asyncio.sleep(0.02)

    def rejected(self, model: str, mode: str) -> str:
        """`mode` was refused: the next one down is tried (and is what later calls start from)."""
        fallback = RESPONSE_MODES_ORDER[min(RESPONSE_MODES_ORDER.index(mode) + 1, len(RESPONSE_MODES_ORDER) - 1)]
        with self._lock:
            if self._learnt.get(model) == mode:
                del self._learnt[model]
            self._next[model] = fallback
        return fallback

    def learnt(self, model: str, mode: str) -> None:
        with self._lock:
            self._learnt[model] = mode

    def release(self, model: str) -> None:
        with self._lock:
            self._probing.discard(model)

    def forget(self) -> None:
        """Start over (tests, or after switching a model's provider)."""
        with self._lock:
            self._learnt.clear()
            self._next.clear()
            self._probing.clear()


RESPONSE_MODES = ResponseModes()
