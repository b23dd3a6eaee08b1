"""Failure modes named from failing verdicts' reasons: the model side of `tracejudge modes propose`.

Every call goes through the judging backend (`resolve_backend`), its retry policy and a strict JSON schema, so a
proposal is made, retried and priced as a judgement is. Step 1 proposes at most N named modes from a sample of
reasons (names are label values: one corrective retry, then JudgeFailed); step 2 sorts each verdict into them or
`other`, several per call.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ._errors import JudgeCallError
from ._judge import OTHER_MODE, json_schema_format, strict_object
from ._litellm import litellm_model_string
from ._retries import RetryPolicy, call_with_retries
from .rubric import MAX_FAILURE_MODES, NAME_PATTERN
from .tiers import TIER_STANDARD, tier_prices

__all__ = ["ITEM_CHARS", "OTHER_MODE", "Item", "JudgeFailed", "ModesJudge", "estimate", "price", "run_rounds"]

ITEM_CHARS = 600  # one verdict's reason and evidence, as the model reads it
BATCH = 20  # verdicts classified per call
OTHER_GROWN = 0.2  # --merge: new modes are proposed only when `other` holds at least this share of the sample
OUTPUT_TOKENS_PER_MODE = 60  # estimates of the answers' lengths (the prompts are counted)
OUTPUT_TOKENS_PER_ITEM = 15
CHARS_PER_TOKEN = 4


class JudgeFailed(RuntimeError):
    """The judge model could not give a usable answer: one line, exit 3."""


@dataclass
class Item:
    """One failing verdict as the model reads it."""

    conversation_id: str
    text: str


def propose_messages(items: Sequence[Item], max_modes: int, keep: Sequence[tuple[str, str]]) -> list[dict[str, str]]:
    kept = "".join(f'- "{name}": {description}\n' for name, description in keep)
    system = (
        "You read the reasons an LLM judge gave for failing verdicts and name what the failures are about. Propose "
        f"at most {max_modes} failure modes, each a name matching {NAME_PATTERN} (lower case, digits, _) and a "
        "one-line description a judge can sort a new failing verdict by. Cover the frequent patterns; leave rare "
        'ones to "other" (never propose "other").'
        + (f"\nThese modes exist already; propose only new ones, never these names:\n{kept}" if keep else "")
    )
    listed = "\n".join(f"[{i}] {item.text}" for i, item in enumerate(items))
    return [{"role": "system", "content": system}, {"role": "user", "content": f"Failing verdicts:\n{listed}"}]


def classify_messages(items: Sequence[Item], modes: Sequence[tuple[str, str]]) -> list[dict[str, str]]:
    listed_modes = "".join(f'- "{name}": {description}\n' for name, description in modes)
    system = (
        "Sort each failing verdict into the one failure mode it is about, by its reason and evidence; "
        f'"other" when none fits.\nFailure modes:\n{listed_modes}- "other": none of the above'
    )
    listed = "\n".join(f"[{i}] {item.text}" for i, item in enumerate(items))
    return [{"role": "system", "content": system}, {"role": "user", "content": f"Failing verdicts:\n{listed}"}]


def propose_format() -> dict[str, Any]:
    mode = strict_object({"name": {"type": "string"}, "description": {"type": "string"}})
    return json_schema_format("failure_modes_proposal", strict_object({"modes": {"type": "array", "items": mode}}))


def classify_format(names: Sequence[str], count: int) -> dict[str, Any]:
    assignment = strict_object(
        {
            "item": {"type": "integer", "enum": list(range(count))},
            "mode": {"type": "string", "enum": [*names, OTHER_MODE]},
        }
    )
    schema = strict_object({"assignments": {"type": "array", "items": assignment}})
    return json_schema_format("failure_modes_classification", schema)


def count_tokens(model: str, messages: list[dict[str, str]]) -> int:
    """litellm's count for the model; characters / 4 where it has none."""
    try:
        import litellm

        return int(litellm.token_counter(model=model, messages=messages))
    except Exception:
        return sum(len(m["content"]) for m in messages) // CHARS_PER_TOKEN


def estimate(model: str, items: Sequence[Item], max_modes: int, keep: Sequence[tuple[str, str]]) -> tuple[int, int]:
    """Input and output tokens of the calls a run makes at most (a proposal, then every item classified; with a
    merge, the items classified twice at worst)."""
    name = litellm_model_string(model)
    stand_in = [(f"mode_{i}", "x" * 80) for i in range(max_modes + len(keep))]
    prompt = count_tokens(name, propose_messages(items, max_modes, keep))
    output = max_modes * OUTPUT_TOKENS_PER_MODE
    rounds = 2 if keep else 1
    for start in range(0, len(items), BATCH):
        batch = items[start : start + BATCH]
        prompt += rounds * count_tokens(name, classify_messages(batch, stand_in))
        output += rounds * len(batch) * OUTPUT_TOKENS_PER_ITEM
    return prompt, output


def price(model: str, input_tokens: int, output_tokens: int) -> float | None:
    """USD at the standard tier from LiteLLM's price map; None for a model it does not list (a local one)."""
    prices = tier_prices(litellm_model_string(model), TIER_STANDARD)
    if prices is None:
        return None
    return input_tokens * prices.input + output_tokens * prices.output


class ModesJudge:
    """The judging backend and retry policy, counting what the calls cost."""

    def __init__(self, model: str, *, retries: int, timeout: float) -> None:
        from ._backends import resolve_backend

        self.backend = resolve_backend(model)
        self.policy = RetryPolicy(max_retries=retries)
        self.timeout = float(timeout)
        self.cost_usd = 0.0
        self.priced = True
        self.calls = 0

    async def ask(self, messages: list[dict[str, str]], response_format: dict[str, Any]) -> Any:
        try:
            reply, _ = await call_with_retries(
                self.backend, messages, timeout=self.timeout, policy=self.policy, response_format=response_format
            )
        except JudgeCallError as exc:
            raise JudgeFailed(f"the judge model {self.backend.model_name} failed: {exc}") from None
        self.calls += 1
        if reply.cost_usd is None:
            self.priced = False
        else:
            self.cost_usd += reply.cost_usd
        try:
            return json.loads(reply.text)
        except (TypeError, ValueError):
            return None


async def propose(
    judge: ModesJudge, items: Sequence[Item], max_modes: int, keep: Sequence[tuple[str, str]]
) -> list[tuple[str, str]]:
    """At most `max_modes` new (name, description); invalid names get one corrective retry, then JudgeFailed."""
    messages = propose_messages(items, max_modes, keep)
    taken = {name for name, _ in keep} | {OTHER_MODE}
    problem = ""
    for round_number in range(2):
        answer = await judge.ask(messages, propose_format())
        modes = answer.get("modes") if isinstance(answer, dict) else None
        if not isinstance(modes, list) or not all(isinstance(m, dict) for m in modes):
            problem = "the answer is not {modes: [{name, description}]}"
        else:
            pairs = [(str(m.get("name", "")), " ".join(str(m.get("description", "")).split())) for m in modes]
            bad = [name for name, _ in pairs if not re.fullmatch(NAME_PATTERN, name)]
            names = [name for name, _ in pairs]
            if bad:
                problem = f"names {bad} do not match {NAME_PATTERN}"
            elif len(pairs) > max_modes:
                problem = f"{len(pairs)} modes; at most {max_modes}"
            elif len(set(names)) != len(names):
                problem = "names must be distinct"
            elif any(not description for _, description in pairs):
                problem = "every mode needs a description"
            else:  # a name already kept (or `other`) is that mode, not a new one
                return [pair for pair in pairs if pair[0] not in taken]
        if round_number == 0:
            messages = [
                *messages,
                {"role": "assistant", "content": json.dumps(answer)},
                {"role": "user", "content": f"That answer is invalid: {problem}. Answer again, corrected."},
            ]
    raise JudgeFailed(f"the judge model proposed no valid modes after a corrective retry: {problem}")


async def classify(judge: ModesJudge, items: Sequence[Item], modes: Sequence[tuple[str, str]]) -> list[str]:
    """Each item's mode; an item the answer leaves out (or an answer that is not the schema) counts as `other`."""
    names = [name for name, _ in modes]
    assigned: list[str] = []
    for start in range(0, len(items), BATCH):
        batch = items[start : start + BATCH]
        answer = await judge.ask(classify_messages(batch, modes), classify_format(names, len(batch)))
        chosen = [OTHER_MODE] * len(batch)
        rows = answer.get("assignments") if isinstance(answer, dict) else None
        for row in rows if isinstance(rows, list) else []:
            if not isinstance(row, dict):
                continue
            index, mode = row.get("item"), row.get("mode")
            if isinstance(index, int) and 0 <= index < len(batch) and mode in names:
                chosen[index] = str(mode)
        assigned.extend(chosen)
    return assigned


async def run_rounds(
    judge: ModesJudge, items: Sequence[Item], max_modes: int, keep: Sequence[tuple[str, str]]
) -> tuple[list[tuple[str, str]], list[str], list[str]]:
    """(taxonomy, each item's mode, notes). Without `keep`: propose from the sample, classify it. With `keep`:
    classify into the kept modes; only where `other` has grown are new modes proposed from its items."""
    if not keep:
        modes = await propose(judge, items, max_modes, ())
        return modes, await classify(judge, items, modes), []
    assigned = await classify(judge, items, keep)
    others = [i for i, mode in enumerate(assigned) if mode == OTHER_MODE]
    room = min(max_modes, MAX_FAILURE_MODES - len(keep))
    if not others or len(others) < OTHER_GROWN * len(items) or room < 1:
        why = "no room (20 modes)" if room < 1 and others else f"`other` holds {len(others)} of {len(items)}"
        return list(keep), assigned, [f"kept the {len(keep)} modes of the merged file; no mode added ({why})"]
    new = await propose(judge, [items[i] for i in others], room, keep)
    again = await classify(judge, [items[i] for i in others], [*keep, *new])
    for i, mode in zip(others, again, strict=True):
        assigned[i] = mode
    used = {mode for mode in again}
    added = [pair for pair in new if pair[0] in used]
    note = f"kept the {len(keep)} modes of the merged file; `other` held {len(others)} of {len(items)}: added "
    note += ", ".join(name for name, _ in added) if added else "none (no proposed mode took a verdict)"
    return [*keep, *added], assigned, [note]
