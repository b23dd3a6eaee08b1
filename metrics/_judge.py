"""The holistic-judge mechanism shared by every metric: prompt, call, parse, validate, one corrective retry."""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import re
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, ClassVar, TypeVar

from pydantic import AliasChoices, BaseModel, Field, ValidationError, field_validator

from tracejudge._shared.rate_limited_log import RateLimitedLog

from ._backends import TIER_FALLBACKS, JudgeBackend, resolve_backend
from ._caching import cacheable_system_prompt
from ._cases import ConversationalEvalTestCase
from ._client import CustomLLMClient, JudgeReply
from ._errors import InvalidJudgeAnswer, JudgeCallError
from ._litellm import _LITELLM_IMPORTED
from ._printing import print_metric_result
from ._results import (
    ERROR_AUTH,
    ERROR_BAD_REQUEST,
    ERROR_CLIENT,
    ERROR_CONNECTION,
    ERROR_EMPTY_CONVERSATION,
    ERROR_INTERNAL,
    ERROR_INVALID_OUTPUT,
    ERROR_PREPARE_TIMEOUT,
    ERROR_RATE_LIMITED,
    ERROR_SERVER,
    ERROR_TIMEOUT,
    MetricResult,
)
from ._retries import RetryPolicy, call_with_retries
from .transcript import DEFAULT_BUDGET_TOKENS, END, START, Redactor, render_transcript, user_message

logger = logging.getLogger("tracejudge.metrics")
DEFAULT_PREPARE_TIMEOUT_S = 30.0  # the built-in redactor does an 8 MB record (the consumer's cap) in about 2 s
_T = TypeVar("_T")
_FENCE = re.compile(r"```(?:json|JSON)?\s*(.*?)```", re.DOTALL)
_MAX_EVIDENCE_ITEMS = 20
_MAX_TEXT = 4_000
OTHER_MODE = "other"  # the failure mode of an answer outside the taxonomy: never a new label value


class JudgeAnswer(BaseModel):
    """What a judge must answer; `key_issues` is accepted for `evidence` (the Flow judge's name for it).
    `failure_mode`: what a failing verdict is about, where the judge has a taxonomy (else absent)."""

    verdict: str
    reason: str = ""
    evidence: list[str] = Field(default_factory=list, validation_alias=AliasChoices("evidence", "key_issues"))
    failure_mode: str | None = None

    @field_validator("failure_mode", mode="before")
    @classmethod
    def _mode_name(cls, value: Any) -> Any:
        return value.strip().lower()[:80] if isinstance(value, str) and value.strip() else None

    @field_validator("verdict", mode="before")
    @classmethod
    def _normalise_label(cls, value: Any) -> Any:
        if isinstance(value, str):
            return value.strip().lower()
        return value

    @field_validator("reason", mode="before")
    @classmethod
    def _reason_text(cls, value: Any) -> Any:
        return "" if value is None else (value if isinstance(value, str) else json.dumps(value, ensure_ascii=False))

    @field_validator("evidence", mode="before")
    @classmethod
    def _evidence_list(cls, value: Any) -> Any:
        if value is None:
            return []
        if isinstance(value, str):
            return [value] if value.strip() else []
        if isinstance(value, list):
            return [item if isinstance(item, str) else json.dumps(item, ensure_ascii=False) for item in value]
        return value


def strict_object(properties: dict[str, Any]) -> dict[str, Any]:
    """A JSON schema object for OpenAI's strict structured output: every property required, no other."""
    return {"type": "object", "properties": properties, "required": list(properties), "additionalProperties": False}


def json_schema_format(name: str, schema: dict[str, Any]) -> dict[str, Any]:
    """The `response_format` that asks for `schema`, strictly."""
    return {"type": "json_schema", "json_schema": {"name": name, "strict": True, "schema": schema}}


def _json_objects(text: str) -> list[Any]:
    """Every JSON value the text could mean: the whole, fenced blocks, then objects embedded in prose."""
    found: list[Any] = []
    stripped = text.strip()
    try:
        found.append(json.loads(stripped))
    except ValueError:
        pass
    for block in _FENCE.findall(text):
        try:
            found.append(json.loads(block.strip()))
        except ValueError:
            pass
    decoder = json.JSONDecoder()
    position = text.find("{")
    while position != -1 and len(found) < 50:
        try:
            value, end = decoder.raw_decode(text, position)
        except ValueError:
            position = text.find("{", position + 1)
            continue
        found.append(value)
        position = text.find("{", end)
    return found


def parse_answer(text: str, labels: frozenset[str], evidence_key: str = "evidence") -> JudgeAnswer:
    """Parse the text into a JudgeAnswer whose verdict is one of `labels`; raise InvalidJudgeAnswer otherwise.
    `evidence_key`: the judge's name for the evidence list (a rubric file's `evidence_key`), read as `evidence`."""
    if not text or not text.strip():
        raise InvalidJudgeAnswer("the answer was empty")
    candidates = [value for value in _json_objects(text) if isinstance(value, dict)]
    if not candidates:
        raise InvalidJudgeAnswer("the answer contained no JSON object")
    problem = "no JSON object had a 'verdict'"
    for candidate in candidates:
        if "verdict" not in candidate:
            continue
        if evidence_key in candidate and evidence_key not in ("evidence", "key_issues"):
            candidate = {**candidate, "evidence": candidate[evidence_key]}
        try:
            answer = JudgeAnswer.model_validate(candidate)
        except ValidationError as exc:
            problem = f"the JSON object did not validate: {exc.errors()[0]['msg']}"
            continue
        if answer.verdict in labels:
            answer.reason = answer.reason[:_MAX_TEXT]
            answer.evidence = [item[:_MAX_TEXT] for item in answer.evidence[:_MAX_EVIDENCE_ITEMS]]
            return answer
        problem = f"verdict {answer.verdict[:80]!r} is not one of: {', '.join(sorted(labels))}"
    raise InvalidJudgeAnswer(problem)


# What to do about each failure reason, for the log line that makes a failure heard.
_ADVICE = {
    ERROR_AUTH: "check the provider's API key (e.g. OPENAI_API_KEY) and its permissions for this model",
    ERROR_BAD_REQUEST: "check the judge model name and the provider's message; retrying cannot help",
    ERROR_CLIENT: (
        "check the judge model string and its provider's configuration (an API key with a newline, whitespace or "
        "non-ASCII characters cannot be sent)"
    ),
    ERROR_CONNECTION: "check that the judge endpoint (e.g. OPENAI_BASE_URL) is reachable",
    ERROR_SERVER: "the judge's server is failing (retryable): check the provider's status",
    ERROR_RATE_LIMITED: "the provider is rate-limiting: lower the judge concurrency or requests per minute",
    ERROR_TIMEOUT: "the judge did not answer in time: raise the judge timeout or check the endpoint",
    ERROR_INVALID_OUTPUT: "the model does not answer in the verdict format: try a stronger judge model",
    ERROR_PREPARE_TIMEOUT: "the redactor (or windowing) did not finish: fix the redactor, or turn redaction off",
    ERROR_INTERNAL: "a tracejudge bug: please report it with this line",
}


class _FailureLogs:
    """One rate-limited WARNING per (metric, model, reason): a failing judge is heard, yet cannot flood the log.
    The keys are bounded: metrics and models are configured, reasons a fixed set."""

    def __init__(self, interval_s: float = 60.0) -> None:
        self.interval_s = interval_s
        self._logs: dict[tuple[str, str, str], RateLimitedLog] = {}
        self._lock = threading.Lock()

    def warning(self, metric: str, model: str, reason: str, conversation: str | None, message: str) -> None:
        with self._lock:
            log = self._logs.get((metric, model, reason))
            if log is None:
                log = self._logs[(metric, model, reason)] = RateLimitedLog(logger, interval_s=self.interval_s)
        advice = _ADVICE.get(reason, "see the message")
        where = f" on conversation {conversation}" if conversation else ""
        log.warning(
            "%s judge %s failed (%s)%s: %s; %s", metric, model, reason, where, " ".join(message.split())[:500], advice
        )


FAILURE_LOGS = _FailureLogs()


class _Preparations:
    """Transcripts are prepared (redacted, windowed) on a thread of their own, with a deadline.

    A thread, not a process: a redactor is any callable (closures included, which cannot be pickled) and the
    preparation needs the whole conversation, which a process would copy. The deadline bounds the judgement, not the
    thread: a thread cannot be killed, so one that never returns is left behind (a daemon, it does not hold up exit)
    while its conversation fails with `prepare_timeout` and the event loop goes on judging the others. Python
    threads take turns on the GIL, C regex matching included, so a stuck redactor slows the loop, it does not stop
    it. `stuck` counts the threads still running past their deadline (each holds one conversation's memory)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.stuck = 0

    async def run(self, work: Callable[[], _T], timeout: float) -> _T:
        loop = asyncio.get_running_loop()
        future: asyncio.Future[_T] = loop.create_future()
        state = {"finished": False, "late": False}  # guarded by self._lock

        def settle(value: Any, error: BaseException | None) -> None:
            if future.done():  # timed out (cancelled): the answer has nobody to go to
                return
            if error is not None:
                future.set_exception(error)
            else:
                future.set_result(value)

        def target() -> None:
            value: Any = None
            error: BaseException | None = None
            try:
                value = work()
            except BaseException as exc:
                error = exc
            finally:
                with self._lock:
                    state["finished"] = True
                    if state["late"]:
                        self.stuck -= 1
            self._deliver(loop, lambda: settle(value, error))

        threading.Thread(target=target, name="tracejudge-prepare", daemon=True).start()
        try:
            return await asyncio.wait_for(future, timeout)
        except TimeoutError:
            with self._lock:
                if not state["finished"]:
                    state["late"] = True
                    self.stuck += 1
            raise

    @staticmethod
    def _deliver(loop: asyncio.AbstractEventLoop, callback: Callable[[], None]) -> None:
        try:
            loop.call_soon_threadsafe(callback)
        except RuntimeError:  # the loop closed while the preparation ran: nobody waits for it any more
            pass


PREPARATIONS = _Preparations()


ESTIMATED_ANSWER_TOKENS = 400  # a verdict, its evidence and a reason: what the budget expects before it has seen one
ESTIMATED_REASONING_TOKENS = 2_000  # a reasoning model's hidden tokens, billed as output (no reasoning_effort is sent)


def _transcript_of(messages: list[dict[str, str]]) -> str | None:
    """The JSON array between the conversation markers of the user message: the turns as the judge saw them."""
    text = next((m["content"] for m in messages if m.get("role") == "user"), "")
    start, end = text.find(START), text.rfind(END)
    return text[start + len(START) : end].strip() if start != -1 and end > start else None


class HolisticJudgeMetric:
    """One LLM call over the whole conversation returns one verdict from a fixed label set, mapped to a score."""

    name: ClassVar[str]
    weights: ClassVar[dict[str, float]]
    system_prompt: ClassVar[str]
    evidence_key: ClassVar[str] = "evidence"  # the prompt's name for the evidence list (Flow: "key_issues")
    extended_examples: ClassVar[str] = ""  # more worked examples, sent only where the rubric is below caching minimum
    # The failure modes a failing verdict is sorted into, (name, description), and the verdicts that get one; the
    # judge names the mode in the same call (`failure_mode`). `other` is always there: an answer outside counts as it.
    taxonomy: ClassVar[tuple[tuple[str, str], ...]] = ()
    taxonomy_alerts: ClassVar[dict[str, float]] = {}  # modes opted into TracejudgeFailureModeShareHigh: threshold
    failing_verdicts: ClassVar[tuple[str, ...]] = ()

    def __init__(
        self,
        model: str | CustomLLMClient | JudgeBackend,
        threshold: float = 0.7,
        verbose: bool = False,
        *,
        timeout: float = 60.0,
        max_retries: int = 3,
        transcript_budget_tokens: int = DEFAULT_BUDGET_TOKENS,
        redactor: Redactor | None = None,
        prepare_timeout: float = DEFAULT_PREPARE_TIMEOUT_S,
        failure_modes: Sequence[tuple[str, str]] | None = None,
        mode_alert_shares: dict[str, float] | None = None,
    ) -> None:
        """`failure_modes`: (name, description) pairs replacing the judge's own taxonomy (`()`: name no mode), with
        `mode_alert_shares` (the modes opted into the mode-share alert, by threshold) replacing its own too."""
        if not 0.0 <= threshold <= 1.0:
            raise ValueError(f"threshold must be within 0..1, got {threshold}")
        if timeout <= 0 or prepare_timeout <= 0:
            raise ValueError("timeout must be positive")
        self.backend = resolve_backend(model)
        self.model = model
        self.threshold = threshold
        self.verbose = verbose
        self.timeout = timeout
        self.retry_policy = RetryPolicy(max_retries=max_retries)
        self.transcript_budget_tokens = transcript_budget_tokens
        self.redactor = redactor
        self.prepare_timeout = prepare_timeout
        self.labels = frozenset(self.weights)
        self._litellm_model: str | None = getattr(self.backend, "litellm_model", None)
        modes = self.taxonomy if failure_modes is None else tuple(failure_modes)
        self.mode_taxonomy: tuple[tuple[str, str], ...] = tuple(
            (name, description) for name, description in modes if name != OTHER_MODE
        )
        replaced = failure_modes is not None or mode_alert_shares is not None
        alerts = (mode_alert_shares or {}) if replaced else self.taxonomy_alerts
        self.mode_alert_shares: dict[str, float] = dict(alerts)

    @property
    def effective_system_prompt(self) -> str:
        """What the judge is really sent: the rubric, with the extended examples where this model's caching minimum
        needs them. Read on every use, so a prompt set on the instance is both sent and versioned."""
        rubric = cacheable_system_prompt(self.system_prompt, self.extended_examples, self._litellm_model)
        return rubric + self._modes_section()

    def _modes_section(self) -> str:
        """The taxonomy, after the rubric (still the static, cacheable prefix): one more key in the same answer."""
        if not self.failure_modes:
            return ""
        failing = ", ".join(self.failing_verdicts)
        lines = [f'- "{name}": {" ".join(description.split())}' for name, description in self.mode_taxonomy]
        lines.append(f'- "{OTHER_MODE}": none of the modes above fits')
        return (
            "\n\n## Failure modes\n\n"
            f'Add the key "failure_mode" to your JSON object. When the verdict is one of: {failing}, it names what the '
            "failure is about, exactly one of:\n" + "\n".join(lines) + '\nFor any other verdict "failure_mode" is null.'
        )

    @property
    def model_name(self) -> str:
        return self.backend.model_name

    @property
    def result_key(self) -> str:
        """What names this judge in a result id: its name (a built-in's rubric changes only with a release); a team's
        rubric file adds its version and hash, so an edited rubric re-judges (`RubricMetric`)."""
        return self.name

    @property
    def failure_modes(self) -> tuple[str, ...]:
        """The mode names a failing verdict may get, `other` last; () where the judge names no mode."""
        if not self.mode_taxonomy or not self.failing_verdicts:
            return ()
        return (*(name for name, _ in self.mode_taxonomy), OTHER_MODE)

    def mode_of(self, verdict: str, named: str | None) -> str | None:
        """The failure mode a verdict counts under: the named one if in the taxonomy, else `other`; None for a verdict
        that is not failing, or a judge without a taxonomy. Never a label value outside the taxonomy."""
        modes = self.failure_modes
        if not modes or verdict not in self.failing_verdicts:
            return None
        return named if named in modes else OTHER_MODE

    def __repr__(self) -> str:
        return f"{type(self).__name__}(model={self.model_name!r}, threshold={self.threshold})"

    @classmethod
    def response_format(cls, modes: Sequence[str] | None = None) -> dict[str, Any]:
        """OpenAI structured output (strict): `verdict` is an enum of exactly this metric's labels; with failure modes
        (default: the class's taxonomy) `failure_mode` is an enum of them, null for a verdict that is not failing."""
        if modes is None:
            modes = [name for name, _ in cls.taxonomy if name != OTHER_MODE]
            modes = [*modes, OTHER_MODE] if modes and cls.failing_verdicts else []
        properties: dict[str, Any] = {
            "verdict": {"type": "string", "enum": sorted(cls.weights)},
            cls.evidence_key: {"type": "array", "items": {"type": "string"}},
            "reason": {"type": "string"},
        }
        if modes:
            properties["failure_mode"] = {"type": ["string", "null"], "enum": [*modes, None]}
        return json_schema_format(f"{cls.name}_verdict", strict_object(properties))

    @property
    def rubric_version(self) -> str:
        """`{metric}@{12 hex}` over what the judge is asked (the system prompt really sent, labels with weights,
        response schema), so a verdict can be told from one made under another rubric; threshold and timeouts do not
        enter it, and the model only where it changes the prompt (extended examples for its caching minimum)."""
        material = json.dumps(
            {
                "system_prompt": self.effective_system_prompt,
                "weights": dict(sorted(self.weights.items())),
                "response_format": self.response_format(self.failure_modes),
            },
            sort_keys=True,
            ensure_ascii=False,
            separators=(",", ":"),
        )
        return f"{self.name}@{hashlib.sha256(material.encode('utf-8', 'surrogatepass')).hexdigest()[:12]}"

    def build_messages(self, conversation: ConversationalEvalTestCase) -> list[dict[str, str]]:
        """System: the static rubric (cacheable prefix). User: the conversation as delimited JSON data."""
        transcript = render_transcript(
            conversation.turns, budget_tokens=self.transcript_budget_tokens, redactor=self.redactor
        )
        return [
            {"role": "system", "content": self.effective_system_prompt},
            {"role": "user", "content": user_message(transcript)},
        ]

    def estimated_cost(self, conversation: ConversationalEvalTestCase) -> float:
        """What the budget reserves for a call at the batch tier before any call has settled: the rubric and the
        turns at ~4 characters a token and an answer of `ESTIMATED_ANSWER_TOKENS` (and `ESTIMATED_REASONING_TOKENS` for
        a reasoning model), at the batch price. A batch
        settles minutes to hours after its requests were reserved; reserved at zero, a whole batch would pass a
        budget worth one call. The interactive tiers settle in seconds (overshoot bounded by the concurrency): 0."""
        from .tiers import TIER_BATCH, tier_cost

        if (
            getattr(self.backend, "tier", None) != TIER_BATCH
            or self._litellm_model is None
            or not _LITELLM_IMPORTED.is_set()  # never LiteLLM's import on the event loop
        ):
            return 0.0
        chars = len(self.effective_system_prompt) + sum(
            len(turn.input or "") + len(turn.actual_output or "") for turn in conversation.turns
        )
        tokens = min(chars // 4, self.transcript_budget_tokens + len(self.effective_system_prompt) // 4)
        try:
            import litellm

            answer = ESTIMATED_ANSWER_TOKENS
            if litellm.supports_reasoning(model=self._litellm_model):
                answer += ESTIMATED_REASONING_TOKENS
            cost = tier_cost(self._litellm_model, TIER_BATCH, input_tokens=tokens, output_tokens=answer)
        except Exception:  # a price map that cannot be read: the budget learns from the first settled call
            return 0.0
        return cost or 0.0

    def _corrective_messages(self, messages: list[dict[str, str]], bad: str, problem: str) -> list[dict[str, str]]:
        allowed = ", ".join(sorted(self.labels))
        return [
            *messages,
            {"role": "assistant", "content": bad[:2_000]},
            {
                "role": "user",
                "content": (
                    f"Your previous answer could not be used: {problem}. Reply again with only one JSON object "
                    f'{{"verdict": ..., "{self.evidence_key}": [...], "reason": ...}} '
                    f"where verdict is exactly one of: {allowed}."
                ),
            },
        ]

    async def evaluate(self, conversation: ConversationalEvalTestCase) -> MetricResult:
        """Judge the conversation; never raises for judge trouble: failures come back as results with `error` set."""
        started = time.perf_counter()
        result = MetricResult(
            name=self.name,
            threshold=self.threshold,
            model=self.model_name,
            rubric_version=self.rubric_version,
            result_key=self.result_key,
        )
        fallbacks = [0]
        token = TIER_FALLBACKS.set(fallbacks)
        try:
            await self._judge(conversation, result)
        except Exception as exc:  # a bug of ours must not abort a batch either
            self._fail(result, ERROR_INTERNAL, f"internal error: {exc!r}")
        finally:
            TIER_FALLBACKS.reset(token)
        result.tier_fallbacks = fallbacks[0]
        result.latency_s = time.perf_counter() - started
        if result.error is not None:
            FAILURE_LOGS.warning(
                self.name, self.model_name, result.error_kind or "unknown", conversation.name, result.error
            )
        if self.verbose:
            print_metric_result(result)
        return result

    # The seeds' library names.
    a_measure = evaluate

    async def _judge(self, conversation: ConversationalEvalTestCase, result: MetricResult) -> None:
        if not conversation.turns:
            self._fail(result, ERROR_EMPTY_CONVERSATION, "the conversation has no turns")
            return
        try:
            messages = await PREPARATIONS.run(lambda: self.build_messages(conversation), self.prepare_timeout)
        except TimeoutError:
            stuck = PREPARATIONS.stuck
            self._fail(
                result,
                ERROR_PREPARE_TIMEOUT,
                f"the transcript was not prepared (redacted, windowed) within {self.prepare_timeout:g}s; "
                f"{stuck} preparation thread{'s' if stuck != 1 else ''} still running past the deadline",
            )
            return
        result.transcript = _transcript_of(messages)
        problem = ""
        for round_number in range(2):  # the answer, then at most one corrective retry
            try:
                reply, attempts = await call_with_retries(
                    self.backend,
                    messages,
                    timeout=self.timeout,
                    policy=self.retry_policy,
                    response_format=self.response_format(self.failure_modes),
                )
            except JudgeCallError as exc:
                result.attempts += exc.attempts
                self._fail(result, exc.kind, str(exc))
                return
            result.attempts += attempts
            self._account(result, reply)
            try:
                answer = parse_answer(reply.text, self.labels, self.evidence_key)
            except InvalidJudgeAnswer as exc:
                problem = str(exc)
                if round_number == 0:
                    messages = self._corrective_messages(messages, reply.text, problem)
                continue
            result.verdict = answer.verdict
            result.score = self.weights[answer.verdict]
            result.success = result.score >= self.threshold
            result.reason = answer.reason
            result.evidence = answer.evidence
            result.failure_mode = self.mode_of(answer.verdict, answer.failure_mode)
            return
        self._fail(result, ERROR_INVALID_OUTPUT, f"invalid judge output after a corrective retry: {problem}")

    @staticmethod
    def _account(result: MetricResult, reply: JudgeReply) -> None:
        def add(current: float | int | None, extra: float | int | None) -> Any:
            if extra is None:
                return current
            return extra if current is None else current + extra

        result.cost_usd = add(result.cost_usd, reply.cost_usd)
        result.input_tokens = add(result.input_tokens, reply.input_tokens)
        result.output_tokens = add(result.output_tokens, reply.output_tokens)
        result.cached_input_tokens = add(result.cached_input_tokens, reply.cached_input_tokens)
        result.cache_write_input_tokens = add(result.cache_write_input_tokens, reply.cache_write_input_tokens)
        result.tier = reply.tier or result.tier

    @staticmethod
    def _fail(result: MetricResult, kind: str, message: str) -> None:
        result.error = message
        result.error_kind = kind
        result.reason = message
        result.score = None
        result.verdict = None
        result.success = False
