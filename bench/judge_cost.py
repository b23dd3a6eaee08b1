"""USD per judged conversation (both metrics), tracejudge against the seeds' library, per judge model.

Both libraries judge one fixed corpus (the demo conversations plus one of 10 and one of 30 turns); their real requests
are captured on the local judge server (bench/judge_tokens.py). Each request is priced with LiteLLM's price list
(`cost_per_token` with the cache reads and writes the provider would report), its tokens counted with
`litellm.token_counter` for that model. Caching follows each provider's rules:

- OpenAI (automatic): a shared prefix of at least 1,024 tokens is cached in 128-token steps, read at the price
  list's `cache_read_input_token_cost` (0.5x gpt-4o-mini, 0.25x gpt-4.1-mini, 0.1x gpt-5-mini).
- Gemini 2.5 Flash (implicit, automatic): a shared prefix of at least 2,048 tokens (Google's current table; it was
  1,024 earlier), read at 0.1x.
- Anthropic: only up to a `cache_control` breakpoint, and only when that prefix reaches the model's minimum cacheable
  length (4,096 tokens for Claude Haiku 4.5, 1,024 for Sonnet 4.5); written at 1.25x, read at 0.1x. The seeds' library
  sends no breakpoint (one user message, rubric and conversation together), so it is never cached on Claude, and its
  ~620-token static prefix is below every automatic minimum, so it is never cached anywhere.

Our system prompt is the one each metric really sends to that model (metrics/_caching.py): the rubric alone where it
clears the model's caching minimum, the rubric with its extended worked examples where only that clears it (Claude
Haiku 4.5, Gemini 2.5 Flash); the base rubric's figures are kept alongside for comparison.

Steady state: the static prefix is in the cache (traffic keeps it warm). Cold: every call misses the cache (no
judgement of that metric within the cache lifetime, 5 minutes on Anthropic); Anthropic bills the write.
`break_even_warm_share`: the share of calls that must find the cache warm for us to cost no more than the seeds'.
Output: the same assumed answer for both libraries (reasoning tokens, e.g. gpt-5-mini's, are left out).

A rubric file's judge (`--judge-file PATH`, repeatable; examples/judges/refund_policy.yaml by default) is priced the
same way beside each built-in: its system prompt (composed from the file, as the judge really sends it to that model)
in place of the built-in's, the same conversation part, the same assumed answer length.
`python -m bench.judge_cost [--judge-file PATH ...]`.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.judge_tokens import _kind, capture, static_prefixes
from tracejudge.metrics import ConversationalFlowRateMetric, FailureRateMetric
from tracejudge.metrics._caching import caching_minimum, prompt_for_minimum
from tracejudge.metrics._litellm import needs_cache_breakpoint
from tracejudge.metrics.rubric import RubricMetric, load_rubrics
from tracejudge.metrics.tiers import TIER_BATCH, TIER_FLEX, TIER_STANDARD, has_tier_price, tier_cost

THEIRS = "eval-ai-library 0.8.2"
ANSWER = json.dumps(
    {
        "verdict": "alternative_proposed",
        "evidence": [
            "Turn 1: the assistant says Atlantis is mythical and has no population data, then asks for a real city.",
            "Turn 2: it gives the trench depth with its source (NOAA) instead of an invented exact figure.",
        ],
        "reason": "The agent admitted the limit of its knowledge and offered a real alternative; nothing was invented.",
    }
)


METRICS = {"failure_rate": FailureRateMetric, "conversational_flow": ConversationalFlowRateMetric}
# A failing verdict, without and with the failure mode the judge names in the same answer (a taxonomy in use).
FAILING_ANSWER = {
    "verdict": "hallucination",
    "evidence": ["Turn 2: the assistant says refunds are accepted for 90 days; the policy it was given says 30."],
    "reason": "The agent stated a refund window that no source supports.",
}


def failure_mode_tokens() -> dict[str, dict[str, int]]:
    """Per model: output tokens of a failing answer without and with `failure_mode`, and the prompt tokens the
    default taxonomy adds to Failure Rate's static (cacheable) system prompt."""
    import litellm

    with_mode = json.dumps({**FAILING_ANSWER, "failure_mode": "invented_policies"})
    without = json.dumps(FAILING_ANSWER)
    figures: dict[str, dict[str, int]] = {}
    for model, caching in MODELS.items():
        name = caching.judge_model
        plain = FailureRateMetric(name, failure_modes=()).effective_system_prompt
        taxonomy = FailureRateMetric(name).effective_system_prompt
        figures[model] = {
            "output_tokens_without_mode": litellm.token_counter(model=name, text=without),
            "output_tokens_with_mode": litellm.token_counter(model=name, text=with_mode),
            "system_prompt_tokens_without_taxonomy": litellm.token_counter(model=name, text=plain),
            "system_prompt_tokens_with_taxonomy": litellm.token_counter(model=name, text=taxonomy),
        }
    return figures


JUDGE_FILES = (str(Path(__file__).resolve().parent.parent / "examples" / "judges" / "refund_policy.yaml"),)


@dataclass(frozen=True)
class Caching:
    """How a model caches a prompt prefix: automatically or only at a breakpoint, from what length, in what steps."""

    price_key: str  # the model's name in LiteLLM's price list (and its token counter)
    judge_model: str  # the LiteLLM model string a user would configure
    minimum: int  # from metrics/_caching.py unless a what-if overrides it
    step: int = 1  # OpenAI caches in 128-token increments past the minimum
    what_if: bool = False  # a hypothetical minimum: our prompt is chosen for it, not read off a metric instance

    @property
    def breakpoint(self) -> bool:
        """Anthropic: cached only up to a `cache_control` block, which we send and the seeds' library does not."""
        return needs_cache_breakpoint(self.judge_model)

    def cached(self, prefix_tokens: int, *, marked: bool) -> int:
        if (self.breakpoint and not marked) or prefix_tokens < self.minimum:
            return 0
        return self.minimum + (prefix_tokens - self.minimum) // self.step * self.step


def _caching(price_key: str, judge_model: str, *, step: int = 1, minimum: int | None = None) -> Caching:
    known = caching_minimum(judge_model)
    assert known is not None, judge_model
    return Caching(price_key, judge_model, known if minimum is None else minimum, step, minimum is not None)


MODELS: dict[str, Caching] = {
    "gpt-4o-mini": _caching("gpt-4o-mini", "openai/gpt-4o-mini", step=128),
    "gpt-4.1-mini": _caching("gpt-4.1-mini", "openai/gpt-4.1-mini", step=128),
    "gpt-5-mini": _caching("gpt-5-mini", "openai/gpt-5-mini", step=128),
    "claude-haiku-4-5": _caching("claude-haiku-4-5", "anthropic/claude-haiku-4-5"),
    "gemini-2.5-flash": _caching("gemini/gemini-2.5-flash", "gemini/gemini-2.5-flash"),
    # Google's earlier table: under a 1,024 minimum the base rubric is cached and no extension is sent.
    "gemini-2.5-flash (1,024 minimum)": _caching("gemini/gemini-2.5-flash", "gemini/gemini-2.5-flash", minimum=1024),
    "claude-sonnet-4-5": _caching("claude-sonnet-4-5", "anthropic/claude-sonnet-4-5"),  # Claude at a 1,024 minimum
}


def our_system_prompts(caching: Caching) -> dict[str, str]:
    """Per metric, the system prompt tracejudge sends to this model (what a metric instance for it really uses)."""
    prompts = {}
    for kind, cls in METRICS.items():
        instance = cls(caching.judge_model)  # its failure-mode section follows the rubric (the cacheable prefix)
        chosen = prompt_for_minimum(cls.system_prompt, cls.extended_examples, caching.minimum)
        chosen += instance._modes_section()
        if not caching.what_if:
            assert chosen == instance.effective_system_prompt, (caching.judge_model, kind)
        prompts[kind] = chosen
    return prompts


def with_system_prompts(requests: list[dict[str, Any]], prompts: dict[str, str]) -> list[dict[str, Any]]:
    """The captured requests with the system message this model's metric sends (the conversation part is shared)."""
    out = []
    for request in requests:
        messages = [dict(m) for m in request["messages"]]
        assert messages[0]["role"] == "system"
        messages[0]["content"] = prompts[_kind(request)]
        out.append({**request, "messages": messages})
    return out


def _long_conversation(turns: int) -> list[tuple[str, str]]:
    """A deterministic support conversation: orders, deliveries and refunds, one topic per turn."""
    items = ["trail shoes", "rain jacket", "camping stove", "headlamp", "sleeping bag", "water filter", "tent pegs"]
    asks = [
        (
            "Where is my order {n} with the {item}?",
            "Order {n} ({item}) left our warehouse on the {d}th and should "
            "arrive within three working days; the tracking number is in your confirmation e-mail.",
        ),
        (
            "Can I change the delivery address for order {n}?",
            "Yes, until it ships. Order {n} has not shipped yet, "
            "so I changed the address to the one you gave; you will get a confirmation.",
        ),
        (
            "The {item} from order {n} arrived damaged.",
            "Sorry about that. I opened a return for order {n}; print "
            "the label from your account and we will send a replacement {item} once it is scanned.",
        ),
        (
            "How long does a refund for order {n} take?",
            "Refunds reach your card five to ten working days after the "
            "return is scanned; order {n}'s return was scanned on the {d}th.",
        ),
        (
            "Do you have the {item} in a larger size?",
            "I cannot see live stock for the {item}; the product page shows "
            "sizes in stock, and you can ask for an e-mail when one comes back.",
        ),
    ]
    conversation = []
    for turn in range(turns):
        question, answer = asks[turn % len(asks)]
        values = {"n": 4100 + turn * 7, "item": items[turn % len(items)], "d": 3 + turn % 25}
        conversation.append((question.format(**values), answer.format(**values)))
    return conversation


def corpus() -> dict[str, list[list[tuple[str, str]]]]:
    from tracejudge.consumer.cli.demo import SCENARIOS

    return {
        "demo": [list(s.turns) for s in SCENARIOS],
        "10 turns": [_long_conversation(10)],
        "30 turns": [_long_conversation(30)],
    }


def _cost(model: str, prompt: int, read: int, written: int, output: int) -> float:
    import litellm
    from litellm.types.utils import PromptTokensDetailsWrapper

    usage = litellm.Usage(
        prompt_tokens=prompt,
        completion_tokens=output,
        total_tokens=prompt + output,
        prompt_tokens_details=PromptTokensDetailsWrapper(cached_tokens=read, cache_creation_tokens=written),
        cache_read_input_tokens=read,
        cache_creation_input_tokens=written,
    )
    prompt_cost, output_cost = litellm.cost_per_token(model=model, usage_object=usage)
    return prompt_cost + output_cost


TIERS = (TIER_FLEX, TIER_BATCH)  # standard is LiteLLM's own `cost_per_token`, as before


def _tier_cost(model: str, tier: str, prompt: int, read: int, written: int, output: int) -> float:
    """At the flex or batch tier: the price list's `*_flex` / `*_batches` prices (metrics/tiers.py)."""
    cost = tier_cost(
        model,
        tier,
        input_tokens=prompt,
        output_tokens=output,
        cached_input_tokens=read,
        cache_write_input_tokens=written,
    )
    assert cost is not None, (model, tier)
    return cost


def price(
    requests: list[dict[str, Any]],
    static: dict[str, str],
    caching: Caching,
    *,
    marked: bool,
    minimum: int | None = None,
) -> dict[str, Any]:
    """USD for these requests at steady state and cold; `minimum` pretends the static prefix had that many tokens."""
    import litellm

    model = caching.price_key
    output = litellm.token_counter(model=model, text=ANSWER)
    prefix = {kind: litellm.token_counter(model=model, text=text) for kind, text in static.items()}
    steady = cold = 0.0
    tiers = [t for t in TIERS if has_tier_price(model, t)]
    tiered = {t: {"steady_usd": 0.0, "cold_usd": 0.0} for t in tiers}
    prompt_total = cached_total = 0
    for request in requests:
        prompt = litellm.token_counter(model=model, messages=request["messages"])
        static_tokens = prefix[_kind(request)]
        if minimum is not None and static_tokens < minimum:
            prompt, static_tokens = prompt + minimum - static_tokens, minimum
        cached = caching.cached(static_tokens, marked=marked)
        steady += _cost(model, prompt, cached, 0, output)
        cold += _cost(model, prompt, 0, cached if caching.breakpoint else 0, output)
        for tier in tiers:  # the same cache behaviour at the tier's prices
            tiered[tier]["steady_usd"] += _tier_cost(model, tier, prompt, cached, 0, output)
            tiered[tier]["cold_usd"] += _tier_cost(model, tier, prompt, 0, cached if caching.breakpoint else 0, output)
        prompt_total += prompt
        cached_total += cached
    return {
        "steady_usd": steady,
        "cold_usd": cold,
        "input_tokens": prompt_total,
        "cached_tokens": cached_total,
        "static_prefix_tokens": prefix,
        "output_tokens_per_call": output,
        "tiers": tiered,
    }


def _break_even(steady: float, cold: float, other: float) -> float | None:
    """The share w of calls that must find the cache warm for w * steady + (1 - w) * cold to equal `other`."""
    if cold <= steady:
        return None
    return min(1.0, max(0.0, (cold - other) / (cold - steady)))


def _per_conversation(figures: dict[str, Any], conversations: int) -> dict[str, Any]:
    return {
        "input_tokens": figures["input_tokens"] / conversations,
        "cached_tokens": figures["cached_tokens"] / conversations,
        "static_prefix_tokens": max(figures["static_prefix_tokens"].values()),
        "output_tokens": figures["output_tokens_per_call"],
        "steady_usd": figures["steady_usd"] / conversations,
        "cold_usd": figures["cold_usd"] / conversations,
    }


def file_judge_cost(
    judge: type[RubricMetric], requests: list[dict[str, Any]], conversations: int
) -> dict[str, dict[str, Any]]:
    """Per model, a rubric file's judge against each built-in: tokens and USD per judged conversation.

    The file's judge sends the built-ins' conversation part (the same windowing and redaction) under its own system
    prompt; the captured Failure Rate requests, one per conversation, carry that part."""
    per_model: dict[str, dict[str, Any]] = {}
    conversation_part = [r for r in requests if _kind(r) == "failure_rate"]
    assert len(conversation_part) == conversations, (len(conversation_part), conversations)
    for model, caching in MODELS.items():
        builtin_prompts = our_system_prompts(caching)
        instance = judge(caching.judge_model)
        prompt = instance.effective_system_prompt  # the rubric, any extension, the failure-mode section
        if caching.what_if:  # the extension chosen for the hypothetical minimum
            rubric = prompt_for_minimum(judge.system_prompt, judge.extended_examples, caching.minimum)
            prompt = rubric + instance._modes_section()
        static = dict.fromkeys(METRICS, prompt)  # whichever kind bench's classifier reads the file's prompt as
        mine = with_system_prompts(conversation_part, static)
        row = {judge.name: _per_conversation(price(mine, static, caching, marked=True), conversations)}
        for kind in METRICS:
            builtin = with_system_prompts([r for r in requests if _kind(r) == kind], builtin_prompts)
            row[kind] = _per_conversation(
                price(builtin, {kind: builtin_prompts[kind]}, caching, marked=True), conversations
            )
        for kind in METRICS:
            row[f"ratio_steady_vs_{kind}"] = row[judge.name]["steady_usd"] / row[kind]["steady_usd"]
        per_model[model] = row
    return per_model


def run(judge_files: tuple[str, ...] | list[str] = JUDGE_FILES) -> dict[str, Any]:
    segments = corpus()
    captured = {name: capture(conversations) for name, conversations in segments.items()}
    ours_all = [r for ours, _ in captured.values() for r in ours]
    theirs_all = [r for _, theirs in captured.values() for r in theirs]
    our_static, their_static = static_prefixes(ours_all, theirs_all)
    conversations = {name: len(c) for name, c in segments.items()}
    for name, (ours, theirs) in captured.items():  # two calls per conversation, one per metric, for each library
        for requests in (ours, theirs) if theirs else (ours,):
            kinds = sorted(_kind(r) for r in requests)
            assert kinds == sorted(["conversational_flow", "failure_rate"] * conversations[name]), (name, kinds)

    out: dict[str, Any] = {
        "corpus": conversations,
        "assumed_output": ANSWER,
        "caching": {
            m: {"judge_model": c.judge_model, "minimum": c.minimum, "breakpoint": c.breakpoint, "step": c.step}
            for m, c in MODELS.items()
        },
        "models": {},
        "failure_mode_tokens": failure_mode_tokens(),
    }
    if not theirs_all:
        print(f"bench: {THEIRS} unavailable, judge_cost has tracejudge only", file=sys.stderr)
    total = sum(conversations.values())
    base_prompts = {kind: cls.system_prompt for kind, cls in METRICS.items()}
    for model, caching in MODELS.items():
        prompts = our_system_prompts(caching)
        extended = prompts != base_prompts
        row: dict[str, Any] = {"system_prompt": "extended" if extended else "base", "segments": {}}
        sums = dict.fromkeys(("ours_steady", "ours_cold", "base_steady", "base_cold", "padded", "padded_cold"), 0.0)
        sums["theirs"] = 0.0
        tier_sums: dict[str, dict[str, float]] = {}
        for name, (ours, theirs) in captured.items():
            count = conversations[name]
            base = price(ours, our_static, caching, marked=True)
            mine = price(with_system_prompts(ours, prompts), prompts, caching, marked=True) if extended else base
            padded = price(ours, our_static, caching, marked=True, minimum=caching.minimum)
            segment = {
                "tracejudge_steady_usd": mine["steady_usd"] / count,
                "tracejudge_cold_usd": mine["cold_usd"] / count,
                "tracejudge_cached_share": mine["cached_tokens"] / mine["input_tokens"],
                "tracejudge_base_prompt_steady_usd": base["steady_usd"] / count,
                "tracejudge_base_prompt_cold_usd": base["cold_usd"] / count,
            }
            for key, figures in (("ours", mine), ("base", base)):
                sums[f"{key}_steady"] += figures["steady_usd"]
                sums[f"{key}_cold"] += figures["cold_usd"]
            for tier, figures in mine["tiers"].items():
                into = tier_sums.setdefault(tier, {"steady_usd": 0.0, "cold_usd": 0.0})
                into["steady_usd"] += figures["steady_usd"]
                into["cold_usd"] += figures["cold_usd"]
            sums["padded"] += padded["steady_usd"]
            sums["padded_cold"] += padded["cold_usd"]
            if theirs:
                their = price(theirs, their_static, caching, marked=False)
                assert their["cached_tokens"] == 0 or not caching.breakpoint
                segment[f"{THEIRS} usd"] = their["steady_usd"] / count
                segment[f"{THEIRS} cached_share"] = their["cached_tokens"] / their["input_tokens"]
                segment["ratio_steady"] = mine["steady_usd"] / their["steady_usd"]
                segment["ratio_cold"] = mine["cold_usd"] / their["steady_usd"]
                sums["theirs"] += their["steady_usd"]
            row["segments"][name] = segment
            row["static_prefix_tokens"] = mine["static_prefix_tokens"]
            row["base_prompt_static_prefix_tokens"] = base["static_prefix_tokens"]
        row["tracejudge_steady_usd"] = sums["ours_steady"] / total
        row["tracejudge_cold_usd"] = sums["ours_cold"] / total
        row["tracejudge_base_prompt_steady_usd"] = sums["base_steady"] / total
        row["tracejudge_base_prompt_cold_usd"] = sums["base_cold"] / total
        row["tracejudge_steady_usd_if_base_prefix_at_minimum"] = sums["padded"] / total
        if sums["theirs"]:
            theirs_total = sums["theirs"]
            row[f"{THEIRS} usd"] = theirs_total / total
            row["ratio_steady"] = sums["ours_steady"] / theirs_total
            row["ratio_cold"] = sums["ours_cold"] / theirs_total
            row["ratio_steady_base_prompt"] = sums["base_steady"] / theirs_total
            row["ratio_cold_base_prompt"] = sums["base_cold"] / theirs_total
            row["ratio_steady_if_base_prefix_at_minimum"] = sums["padded"] / theirs_total
            row["ratio_cold_if_base_prefix_at_minimum"] = sums["padded_cold"] / theirs_total
            # Share w of calls finding the cache warm at which w * steady + (1 - w) * cold equals the seeds' cost.
            row["break_even_warm_share"] = _break_even(sums["ours_steady"], sums["ours_cold"], theirs_total)
        # A column per tier: USD per judged conversation and the ratio to the seeds' library (steady, cold).
        tiers_row: dict[str, dict[str, float]] = {
            TIER_STANDARD: {"steady_usd": sums["ours_steady"] / total, "cold_usd": sums["ours_cold"] / total}
        }
        for tier, figures in tier_sums.items():
            tiers_row[tier] = {"steady_usd": figures["steady_usd"] / total, "cold_usd": figures["cold_usd"] / total}
        if sums["theirs"]:
            for figures in tiers_row.values():
                figures["ratio_steady"] = figures["steady_usd"] * total / sums["theirs"]
                figures["ratio_cold"] = figures["cold_usd"] * total / sums["theirs"]
        row["tiers"] = tiers_row
        row["cheapest_tier"] = min(tiers_row, key=lambda t: (tiers_row[t]["steady_usd"], t != TIER_FLEX))
        if extended:  # against our own base rubric, which is never cached on this model
            row["break_even_warm_share_vs_base_prompt"] = _break_even(
                sums["ours_steady"], sums["ours_cold"], sums["base_steady"]
            )
        out["models"][model] = row
    if judge_files:
        judges = load_rubrics(judge_files)
        out["judge_files"] = {
            name: {"file": Path(cls.source).name, "per_model": file_judge_cost(cls, ours_all, total)}
            for name, cls in judges.items()
        }
    return out


def table_rows(result: dict[str, Any]) -> list[tuple[str, str, str, str]]:
    """Rows for `make bench`'s printed table: USD per 1,000 judged conversations, and the ratios."""
    rows = []
    for model, row in result["models"].items():
        ours = f"${row['tracejudge_steady_usd'] * 1e3:.2f} steady, ${row['tracejudge_cold_usd'] * 1e3:.2f} cold"
        if "ratio_steady" in row:
            theirs = f"seeds' ${row[f'{THEIRS} usd'] * 1e3:.2f}"
            ratio = f"{row['ratio_steady']:.2f}x steady, {row['ratio_cold']:.2f}x cold"
        else:
            theirs, ratio = "seeds' n/a", ""
        note = "per 1,000 judged conversations" + (
            ", extended rubric" if row.get("system_prompt") == "extended" else ""
        )
        rows.append((f"judge cost, {model}", f"{ours}; {theirs}", ratio, note))
        for tier, figures in row.get("tiers", {}).items():
            if tier == TIER_STANDARD:
                continue
            cost = f"${figures['steady_usd'] * 1e3:.2f} steady, ${figures['cold_usd'] * 1e3:.2f} cold"
            ratio = (
                f"{figures['ratio_steady']:.2f}x steady, {figures['ratio_cold']:.2f}x cold"
                if "ratio_steady" in figures
                else ""
            )
            rows.append((f"judge cost, {model}, {tier} tier", cost, ratio, "per 1,000 judged conversations"))
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.judge_cost", description=__doc__.splitlines()[0])
    parser.add_argument(
        "--judge-file",
        action="append",
        metavar="PATH",
        help="a rubric file whose judge is priced beside the built-ins (repeatable; default: "
        "examples/judges/refund_policy.yaml)",
    )
    args = parser.parse_args(argv)
    print(json.dumps(run(tuple(args.judge_file) if args.judge_file else JUDGE_FILES), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
