"""`tracejudge calibrate` and `consume --calibration`: exact figures from scripted judges, hand-computed statistics,
dataset validation before any judge call, the built-in gold set, and the corrected-rate series on a real consumer."""

from __future__ import annotations

import hashlib
import json
import math
import re
import urllib.request
from collections import Counter
from importlib import metadata
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from tests.support.judge_server import JudgeServer, Reply, conversation_text, metric_of, verdict
from tests.support.pipeline import RunningConsumer, consumer_settings, play, traced_app, wait_for
from tracejudge.consumer.cli import main
from tracejudge.consumer.cli.calibrate import LABELS, Outcome, load_dataset, metric_report, run_calibrate
from tracejudge.consumer.cli.parser import build_parser
from tracejudge.consumer.embedded_broker import EmbeddedBroker
from tracejudge.consumer.emit.prometheus import ConsumerInstruments
from tracejudge.metrics import ConversationalFlowRateMetric, CustomLLMClient, FailureRateMetric, MetricResult
from tracejudge.metrics.calibration import (
    CalibrationError,
    HallucinationCalibration,
    cohen_kappa,
    corrected_rate,
    load_hallucination_calibration,
)
from tracejudge.metrics.failure_rate import FAILURE_RATE_SYSTEM_PROMPT

# item → (gold Failure Rate, judge's Failure Rate, gold Flow, judge's Flow); None: no label / judge answers garbage.
SCRIPT: dict[str, tuple[str, str | None, str | None, str | None]] = {
    "i1": ("hallucination", "hallucination", "fully", "fully"),
    "i2": ("hallucination", "hallucination", "fully", "mostly"),
    "i3": ("hallucination", "hallucination", "mostly", "mostly"),
    "i4": ("hallucination", "mixed", "partial", "minor"),
    "i5": ("stall", "stall", "minor", "minor"),
    "i6": ("stall", "hallucination", "none", "partial"),
    "i7": ("honest_fallback", "honest_fallback", None, None),
    "i8": ("honest_fallback", "alternative_proposed", None, None),
    "i9": ("not_applicable", "not_applicable", None, None),
    "i10": ("not_applicable", "not_applicable", None, None),
    "i11": ("mixed", None, None, None),  # the judge never gives a valid verdict: a failure, outside the matrix
}
_TOKEN = re.compile(r"\[(i\d+)\]")


def write_dataset(path: Path) -> Path:
    lines = []
    for item, (gold_fr, _, gold_flow, _) in SCRIPT.items():
        labels = {"failure_rate": gold_fr} | ({"conversational_flow": gold_flow} if gold_flow else {})
        turns = [
            {"user": f"[{item}] Where is my order?", "assistant": "It shipped yesterday."},
            {"user": "Thanks.", "assistant": "You're welcome."},
        ]
        lines.append(json.dumps({"id": item, "turns": turns, "labels": labels, "note": "scripted"}))
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def scripted_verdict(metric: str, user_text: str) -> str | None:
    item = _TOKEN.search(user_text)
    assert item is not None
    _, judge_fr, _, judge_flow = SCRIPT[item.group(1)]
    return judge_fr if metric == "failure_rate" else judge_flow


class ScriptedJudge(CustomLLMClient):
    """Mislabels known items (see SCRIPT); 0.001 USD per call."""

    def __init__(self) -> None:
        self.calls = 0

    async def chat_complete(self, messages: list[dict[str, str]], temperature: float) -> tuple[str, float | None]:
        self.calls += 1
        # Failure Rate's prompt, then its failure-mode taxonomy (appended since failure modes came in).
        system = messages[0]["content"]
        metric = "failure_rate" if system.startswith(FAILURE_RATE_SYSTEM_PROMPT) else "conversational_flow"
        label = scripted_verdict(metric, messages[1]["content"])
        if label is None:
            return "I would rather not say.", 0.001
        return json.dumps({"verdict": label, "evidence": ["turn 1"], "reason": "scripted"}), 0.001

    def get_model_name(self) -> str:
        return "scripted-judge"


def calibrate(argv: list[str], judge: CustomLLMClient) -> int:
    return run_calibrate(build_parser().parse_args(["calibrate", *argv]), judge=judge)


# Hand-computed from SCRIPT.
# Failure Rate, 10 verdicts (i11 failed). Rows gold, columns judge, in rubric order
# (hallucination, stall, mixed, honest_fallback, alternative_proposed, not_applicable):
FR_MATRIX = [
    [3, 0, 1, 0, 0, 0],
    [1, 1, 0, 0, 0, 0],
    [0, 0, 0, 0, 0, 0],
    [0, 0, 0, 1, 1, 0],
    [0, 0, 0, 0, 0, 0],
    [0, 0, 0, 0, 0, 2],
]
FR_ACCURACY = 7 / 10  # 3 + 1 + 1 + 2 on the diagonal
# Row totals 4, 2, 0, 2, 0, 2; column totals 4, 1, 1, 1, 1, 2:
# p_e = (4·4 + 2·1 + 0·1 + 2·1 + 0·1 + 2·2) / 10² = 24/100; kappa = (0.70 − 0.24) / (1 − 0.24) = 0.46/0.76.
FR_KAPPA = 0.46 / 0.76  # 0.6052631578947368
# Flow, 6 verdicts, levels fully, mostly, partial, minor, none (indices 0-4), weight |i − j| / 4:
# pairs (0,0) (0,1) (1,1) (2,3) (3,3) (4,2): observed disagreement (0.25 + 0.25 + 0.5) / 6 = 1/6.
# Row totals 2, 1, 1, 1, 1; column totals 1, 2, 1, 2, 0; expected Σ w·r·c / 36 = 13.5 / 36 = 0.375.
FLOW_MATRIX = [
    [1, 1, 0, 0, 0],
    [0, 1, 0, 0, 0],
    [0, 0, 0, 1, 0],
    [0, 0, 0, 1, 0],
    [0, 0, 1, 0, 0],
]
FLOW_ACCURACY = 3 / 6
FLOW_KAPPA = 1 - (1 / 6) / 0.375  # 5/9 = 0.5555...


def test_scripted_judge_exact_report(tmp_path: Path) -> None:
    dataset = write_dataset(tmp_path / "gold.jsonl")
    out = tmp_path / "report.json"
    judge = ScriptedJudge()
    code = calibrate(["--dataset", str(dataset), "--output", str(out), "--judge-retries", "0"], judge)
    assert code == 0
    report = json.loads(out.read_text())
    fr, flow = report["metrics"]["failure_rate"], report["metrics"]["conversational_flow"]
    assert fr["labels"] == list(LABELS["failure_rate"])
    assert flow["labels"] == ["fully", "mostly", "partial", "minor", "none"]
    assert fr["confusion_matrix"] == FR_MATRIX
    assert flow["confusion_matrix"] == FLOW_MATRIX
    assert (fr["labelled"], fr["n"], fr["judge_failures"]) == (11, 10, 1)
    assert fr["judge_failure_kinds"] == {"invalid_output": 1}
    assert (flow["labelled"], flow["n"], flow["judge_failures"]) == (6, 6, 0)
    assert fr["accuracy"] == pytest.approx(FR_ACCURACY)
    assert fr["kappa"] == pytest.approx(FR_KAPPA) and fr["kappa_weighting"] == "unweighted"
    assert flow["accuracy"] == pytest.approx(FLOW_ACCURACY)
    assert flow["kappa"] == pytest.approx(FLOW_KAPPA) and flow["kappa_weighting"] == "linear"
    # hallucination against the rest: tp 3 (i1-i3), fn 1 (i4), fp 1 (i6), tn 5.
    assert fr["hallucination"] == pytest.approx(
        {
            "tp": 3,
            "fp": 1,
            "fn": 1,
            "tn": 5,
            "precision": 0.75,
            "recall": 0.75,
            "f1": 0.75,
            "sensitivity": 0.75,
            "specificity": 5 / 6,
        }
    )
    assert "hallucination" not in flow
    # 10 + 6 valid calls + i11's answer and its corrective retry, 0.001 USD each.
    assert judge.calls == 18
    assert report["cost_usd"] == pytest.approx(0.018)
    assert report["judge_model"] == "scripted-judge"
    assert report["tracejudge_version"] == metadata.version("tracejudge")
    assert report["dataset"]["sha256"] == hashlib.sha256(dataset.read_bytes()).hexdigest()
    assert fr["rubric_version"] == getattr(FailureRateMetric("x"), "rubric_version", None)
    assert flow["rubric_version"] == getattr(ConversationalFlowRateMetric("x"), "rubric_version", None)
    failed = [i for i in report["items"] if i["error"]]
    assert failed == [
        {"id": "i11", "metric": "failure_rate", "gold": "mixed", "judge": None, "error": "invalid_output"}
    ]
    # The report is what `consume --calibration` reads.
    calibration = load_hallucination_calibration(out)
    assert (calibration.tp, calibration.fn, calibration.tn, calibration.fp) == (3, 1, 5, 1)


@pytest.mark.parametrize(
    ("gates", "code"),
    [
        (["--min-accuracy", "0.5", "--min-kappa", "0.55"], 0),  # 0.7/0.5 accuracy, 0.605/0.556 kappa: all met
        (["--min-accuracy", "0.5"], 0),
        (["--min-kappa", "0.6"], 1),  # Flow's 5/9 misses
        (["--min-accuracy", "0.6"], 1),  # Flow's 0.5 misses
        (["--min-accuracy", "0.6", "--metrics", "failure_rate"], 0),  # only Failure Rate judged: 0.7 passes
    ],
)
def test_gate_exit_codes(tmp_path: Path, gates: list[str], code: int, capsys: pytest.CaptureFixture[str]) -> None:
    dataset = write_dataset(tmp_path / "gold.jsonl")
    assert calibrate(["--dataset", str(dataset), "--judge-retries", "0", *gates], ScriptedJudge()) == code
    if code == 1:
        assert "gate missed" in capsys.readouterr().out


GOOD = {"id": "a", "turns": [{"user": "hi", "assistant": "hello"}], "labels": {"failure_rate": "stall"}}


@pytest.mark.parametrize(
    ("bad_line", "message"),
    [
        ("{not json", "invalid JSON"),
        (json.dumps(GOOD | {"id": "b", "labels": {"failure_rate": "fabrication"}}), "unknown failure_rate label"),
        (json.dumps(GOOD | {"id": "b", "labels": {"conversational_flow": "great"}}), "unknown conversational_flow"),
        (json.dumps(GOOD | {"id": "b", "labels": {"toxicity": "low"}}), "unknown metric"),
        (json.dumps(GOOD | {"id": "b", "turns": []}), "has no turns"),
        (json.dumps({k: v for k, v in GOOD.items() if k != "turns"} | {"id": "b"}), "has no turns"),
        (json.dumps(GOOD | {"id": "b", "turns": [{"user": "hi"}]}), "turn 1"),
        (json.dumps(GOOD), "duplicate id 'a'"),
        (json.dumps(GOOD | {"id": ""}), "'id'"),
        ("[1, 2]", "JSON object"),
    ],
)
def test_bad_dataset_line_exits_2_before_any_judge_call(
    tmp_path: Path, bad_line: str, message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text(f"{json.dumps(GOOD)}\n\n{bad_line}\n{json.dumps(GOOD | {'id': 'c'})}\n", encoding="utf-8")
    judge = ScriptedJudge()
    assert calibrate(["--dataset", str(path)], judge) == 2
    err = capsys.readouterr().err.strip()
    assert "bad.jsonl:3: " in err and message in err and "\n" not in err
    assert judge.calls == 0


def test_dataset_tolerates_extra_fields_and_null_labels(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "gold.jsonl"
    extra = GOOD | {"id": "x", "source": "prod", "labels": {"failure_rate": None, "conversational_flow": "fully"}}
    path.write_text(json.dumps(extra) + "\n" + json.dumps(GOOD | {"id": 7}) + "\n")
    items = load_dataset(str(path)).items
    assert [(i.id, i.labels) for i in items] == [
        ("x", {"conversational_flow": "fully"}),
        ("7", {"failure_rate": "stall"}),
    ]
    judge = ScriptedJudge()
    only_flow = tmp_path / "flow.jsonl"
    only_flow.write_text(json.dumps(extra) + "\n")
    assert calibrate(["--dataset", str(only_flow), "--metrics", "failure_rate"], judge) == 2
    assert "no conversation has a label for failure_rate" in capsys.readouterr().err
    assert judge.calls == 0


@pytest.mark.parametrize(
    "argv",
    [
        ["--min-accuracy", "1.5"],
        ["--min-kappa", "-2"],
        ["--metrics", "failure_rate,toxicity"],
        ["--max-concurrency", "0"],
        ["--dataset", "/nonexistent/gold.jsonl"],
        ["--output", "/nonexistent/dir/report.json"],
        ["--output", "/"],
    ],
)
def test_bad_arguments_exit_2(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    judge = ScriptedJudge()
    try:
        code = calibrate(argv, judge)
    except SystemExit as exc:  # settings errors leave through SystemExit(2), as for `consume`
        code = int(str(exc.code))
    assert code == 2
    assert judge.calls == 0
    assert len(capsys.readouterr().err.strip().splitlines()) == 1


def test_budget_exhausted_items_are_judge_failures(tmp_path: Path) -> None:
    dataset = write_dataset(tmp_path / "gold.jsonl")
    out = tmp_path / "report.json"
    argv = ["--dataset", str(dataset), "--output", str(out), "--max-concurrency", "1", "--max-cost-per-hour", "0.0025"]
    judge = ScriptedJudge()
    assert calibrate([*argv, "--metrics", "failure_rate"], judge) == 0
    fr = json.loads(out.read_text())["metrics"]["failure_rate"]
    # As in `consume`: a call is admitted if spent + its estimate (mean cost so far) fits: 0 + 0, 0.001 + 0.001,
    # then 0.002 + 0.001 > 0.0025 stops every further call.
    assert judge.calls == 2
    assert fr["n"] == 2 and fr["judge_failure_kinds"] == {"skipped_budget": 9}
    assert sum(map(sum, fr["confusion_matrix"])) == 2


def test_calibrate_cli_over_http_through_litellm(tmp_path: Path, judge_server: JudgeServer) -> None:
    """The command with a model string: LiteLLM over real HTTP to the local OpenAI-compatible judge server."""

    def respond(request: dict[str, Any]) -> Reply:
        label = scripted_verdict(metric_of(request), conversation_text(request))
        return verdict(label) if label else Reply(content="no idea")

    judge_server.responder = respond
    dataset = write_dataset(tmp_path / "gold.jsonl")
    out = tmp_path / "report.json"
    argv = ["calibrate", "--dataset", str(dataset), "--judge-model", "scripted-judge", "--output", str(out)]
    assert main([*argv, "--judge-retries", "0", "--min-accuracy", "0.5", "--min-kappa", "0.55"]) == 0
    report = json.loads(out.read_text())
    assert report["judge_model"] == "scripted-judge"
    assert report["metrics"]["failure_rate"]["confusion_matrix"] == FR_MATRIX
    assert report["metrics"]["conversational_flow"]["kappa"] == pytest.approx(FLOW_KAPPA)
    assert report["input_tokens"] > 0 and report["output_tokens"] > 0
    assert main([*argv, "--judge-retries", "0", "--min-kappa", "0.6"]) == 1
    # Redaction works as in `consume`: the e-mail in a turn never reaches the judge.
    email = tmp_path / "email.jsonl"
    email.write_text(
        json.dumps(
            {
                "id": "e",
                "turns": [{"user": "[i9] mail me at ann@example.com", "assistant": "ok"}],
                "labels": GOOD["labels"],
            }
        )
        + "\n"
    )
    assert main(["calibrate", "--dataset", str(email), "--judge-model", "scripted-judge", "--judge-retries", "0"]) == 0
    assert "ann@example.com" not in conversation_text(judge_server.requests[-1])


def test_builtin_gold_set() -> None:
    dataset = load_dataset(None)
    items = dataset.items
    assert dataset.builtin and len(items) >= 120
    assert len({item.id for item in items}) == len(items)
    fr = Counter(item.labels["failure_rate"] for item in items if "failure_rate" in item.labels)
    flow = Counter(item.labels["conversational_flow"] for item in items if "conversational_flow" in item.labels)
    assert set(fr) == set(FailureRateMetric.weights) and min(fr.values()) >= 15, fr
    assert set(flow) == set(ConversationalFlowRateMetric.weights) and min(flow.values()) >= 12, flow
    for item in items:
        assert 2 <= len(item.turns) <= 6, item.id
        assert all(user.strip() and assistant.strip() for user, assistant in item.turns), item.id
        assert item.note and "\n" not in item.note, item.id
    domains = Counter(item.id.split("-")[0] for item in items)
    assert set(domains) == {"support", "billing", "travel", "coding", "retrieval", "tools"}
    assert min(domains.values()) >= 10, domains


def test_corrected_rate_and_interval_hand_computed() -> None:
    calibration = HallucinationCalibration.from_counts(tp=18, fn=2, tn=95, fp=5)  # Se 0.90, Sp 0.95
    z = 1.959963984540054
    z2 = z * z
    # Window: 60 hallucinations in 300 judged conversations, p = 0.2.
    # Rogan–Gladen: (0.2 + 0.95 − 1) / (0.9 + 0.95 − 1) = 0.15 / 0.85.
    estimate = 0.15 / 0.85
    p, n_p = (60 + z2 / 2) / (300 + z2), 300 + z2  # Agresti–Coull-adjusted share and size
    se, n_se = (18 + z2 / 2) / (20 + z2), 20 + z2
    sp, n_sp = (95 + z2 / 2) / (100 + z2), 100 + z2
    variance = (p * (1 - p) / n_p + estimate**2 * se * (1 - se) / n_se + (1 - estimate) ** 2 * sp * (1 - sp) / n_sp) / (
        se + sp - 1
    ) ** 2
    half = z * math.sqrt(variance)
    rate = corrected_rate(60, 300, calibration)
    assert rate.estimate == pytest.approx(estimate) and rate.estimate == pytest.approx(0.1764706, abs=1e-7)
    assert (rate.lower, rate.upper) == pytest.approx((estimate - half, estimate + half))
    assert (rate.lower, rate.upper) == pytest.approx((0.0911716, 0.2617695), abs=1e-7)
    # A smaller window, same share: wider, and the lower end clips at 0 (half-width 0.1955 > 0.1765).
    small = corrected_rate(6, 30, calibration)
    assert small.estimate == pytest.approx(estimate)
    assert (small.lower, small.upper) == pytest.approx((0.0, 0.3719868), abs=1e-7)
    # Observed share below 1 − Sp: every observed hallucination is explained by false positives.
    none = corrected_rate(1, 50, calibration)
    assert none.estimate == 0.0 and none.lower == 0.0 and 0.0 < none.upper < 0.2
    # Above Se: clipped to 1.
    assert corrected_rate(50, 50, calibration).estimate == 1.0


def test_statistics_edge_cases() -> None:
    assert cohen_kappa([[5, 0], [0, 0]]) is None  # everything in one category: chance agreement is 1
    assert cohen_kappa([[2, 0], [0, 2]]) == 1.0
    assert cohen_kappa([[0, 2], [2, 0]]) == -1.0
    with pytest.raises(CalibrationError, match="no information"):
        HallucinationCalibration.from_counts(tp=5, fn=5, tn=5, fp=5)  # 0.5 + 0.5 = 1
    with pytest.raises(CalibrationError, match="both with and without"):
        HallucinationCalibration.from_counts(tp=0, fn=0, tn=5, fp=0)


def write_calibration(path: Path, tp: int, fn: int, tn: int, fp: int) -> Path:
    stats = {"tp": tp, "fn": fn, "tn": tn, "fp": fp}
    path.write_text(json.dumps({"metrics": {"failure_rate": {"hallucination": stats}}}))
    return path


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ({"tp": 4, "fn": 6, "tn": 6, "fp": 4}, "no information"),  # 0.4 + 0.6 = 1
        ({"tp": 2, "fn": 8, "tn": 5, "fp": 5}, "no information"),  # 0.2 + 0.5 < 1
        (None, "cannot read"),
        ("garbage", "not a JSON"),
        ({"tp": 4}, "no metrics.failure_rate.hallucination"),
    ],
)
@pytest.mark.parametrize("via", ["flag", "env"])
def test_consume_refuses_a_useless_or_bad_calibration(
    tmp_path: Path,
    content: Any,
    message: str,
    via: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    path = tmp_path / "report.json"
    if isinstance(content, dict) and len(content) == 4:
        write_calibration(path, **content)
    elif isinstance(content, dict):
        path.write_text(json.dumps({"metrics": {"failure_rate": {"hallucination": content}}}))
    elif content is not None:
        path.write_text(content)
    argv = ["consume", "--bootstrap-servers", "127.0.0.1:1"]
    if via == "flag":
        argv += ["--calibration", str(path)]
    else:
        monkeypatch.setenv("TRACEJUDGE_CALIBRATION", str(path))
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1


def test_corrected_series_only_with_calibration(tmp_path: Path) -> None:
    plain = CollectorRegistry()
    instruments = ConsumerInstruments(plain)
    instruments.windows.add("failure_rate", "bot", 0.0, "hallucination")
    assert plain.get_sample_value("tracejudge_hallucination_rate", {"agent": "bot"}) == 1.0
    assert b"corrected" not in generate_latest(plain)

    calibrated = CollectorRegistry()
    calibration = HallucinationCalibration.from_counts(tp=18, fn=2, tn=95, fp=5)
    instruments = ConsumerInstruments(calibrated, window_sessions=300, calibration=calibration)
    assert calibrated.get_sample_value("tracejudge_hallucination_rate_corrected", {"agent": "bot"}) is None
    for i in range(300):
        instruments.windows.add("failure_rate", "bot", 1.0, "hallucination" if i < 60 else "not_applicable")
    expected = corrected_rate(60, 300, calibration)
    get = calibrated.get_sample_value
    assert get("tracejudge_hallucination_rate", {"agent": "bot"}) == pytest.approx(0.2)
    assert get("tracejudge_hallucination_rate_corrected", {"agent": "bot"}) == pytest.approx(0.1764706, abs=1e-7)
    assert get("tracejudge_hallucination_rate_corrected_lower", {"agent": "bot"}) == pytest.approx(expected.lower)
    assert get("tracejudge_hallucination_rate_corrected_upper", {"agent": "bot"}) == pytest.approx(expected.upper)


def _always(label: str) -> Any:
    def respond(request: dict[str, Any]) -> Reply:
        text = conversation_text(request)
        return verdict("hallucination" if "moon base" in text else label)

    return respond


def test_consume_with_calibration_exports_corrected_series(
    tmp_path: Path, broker: EmbeddedBroker, topic: str, judge_server: JudgeServer
) -> None:
    judge_server.responder = _always("not_applicable")
    report = write_calibration(tmp_path / "report.json", tp=9, fn=1, tn=18, fp=2)  # Se 0.9, Sp 0.9
    settings = consumer_settings(broker.bootstrap_servers, topic, metrics=["failure_rate"], calibration=str(report))
    provider = traced_app(broker.bootstrap_servers, topic)
    with RunningConsumer(settings) as consumer:
        play(
            provider,
            {
                "cal-0": [("Is there a moon base?", "Yes, the moon base opened in 2019 with 40 staff.")],
                **{f"cal-{i}": [(f"What is {i} + {i}?", f"{2 * i}.")] for i in range(1, 4)},
            },
        )
        wait_for(lambda: consumer.sessions("judged") == 4, what="4 judged conversations")
        assert consumer.value("tracejudge_hallucination_rate", agent="support") == 0.25
        # Rogan–Gladen: (0.25 + 0.9 − 1) / (0.9 + 0.9 − 1) = 0.15 / 0.8 = 0.1875.
        assert consumer.value("tracejudge_hallucination_rate_corrected", agent="support") == pytest.approx(0.1875)
        expected = corrected_rate(1, 4, load_hallucination_calibration(report))
        lower = consumer.value("tracejudge_hallucination_rate_corrected_lower", agent="support")
        upper = consumer.value("tracejudge_hallucination_rate_corrected_upper", agent="support")
        assert (lower, upper) == pytest.approx((expected.lower, expected.upper))
        assert 0.0 <= lower < 0.1875 < upper <= 1.0
        assert consumer.app.metrics_url is not None
        scrape = urllib.request.urlopen(consumer.app.metrics_url, timeout=10).read().decode()
        for name in ("corrected", "corrected_lower", "corrected_upper"):
            assert re.search(rf'^tracejudge_hallucination_rate_{name}{{agent="support"}} ', scrape, re.M), name
    provider.shutdown()


def test_duplicate_metric_is_judged_once(tmp_path: Path) -> None:
    dataset = write_dataset(tmp_path / "gold.jsonl")
    out = tmp_path / "report.json"
    judge = ScriptedJudge()
    argv = ["--dataset", str(dataset), "--output", str(out), "--judge-retries", "0"]
    assert calibrate([*argv, "--metrics", "failure_rate,failure_rate"], judge) == 0
    assert judge.calls == 12  # 11 items once each, plus i11's corrective retry
    assert json.loads(out.read_text())["metrics"]["failure_rate"]["labelled"] == 11


def test_line_separator_inside_a_string_is_not_a_line_break(tmp_path: Path) -> None:
    path = tmp_path / "gold.jsonl"
    odd = GOOD | {"id": "u", "turns": [{"user": "a\u2028b\x85c", "assistant": "ok"}]}
    path.write_text(json.dumps(odd, ensure_ascii=False) + "\n{bad\n", encoding="utf-8")
    with pytest.raises(ValueError, match=r"gold.jsonl:2: invalid JSON"):
        load_dataset(str(path))
    path.write_text(json.dumps(odd, ensure_ascii=False) + "\n", encoding="utf-8")
    assert load_dataset(str(path)).items[0].turns == (("a\u2028b\x85c", "ok"),)


def test_report_sums_every_token_kind() -> None:
    item = load_dataset(None).items[0]
    results = [
        MetricResult(
            name="failure_rate",
            verdict="stall",
            score=0.4,
            threshold=0.7,
            model="m",
            cost_usd=0.01,
            input_tokens=1000,
            output_tokens=50,
            cached_input_tokens=600,
            cache_write_input_tokens=300,
        ),
        MetricResult(name="failure_rate", threshold=0.7, model="m", error="x", error_kind="timeout", input_tokens=10),
    ]
    report = metric_report("failure_rate", [Outcome(item, "failure_rate", r) for r in results])
    assert (report["input_tokens"], report["output_tokens"]) == (1010, 50)
    assert (report["cached_input_tokens"], report["cache_write_input_tokens"]) == (600, 300)
    assert report["cost_usd"] == pytest.approx(0.01) and report["judge_failures"] == 1


def test_demo_refuses_a_bad_calibration_from_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = write_calibration(tmp_path / "report.json", tp=4, fn=6, tn=6, fp=4)
    monkeypatch.setenv("TRACEJUDGE_CALIBRATION", str(bad))
    assert main(["demo", "--bootstrap-servers", "127.0.0.1:1"]) == 2
    err = capsys.readouterr().err.strip()
    assert "no information" in err and len(err.splitlines()) == 1


# A rubric file's judge: 20 conversations, gold (rows) × scripted judge (columns) in the file's label order
# compliant, minor_deviation, violation: [[7, 1, 0], [1, 4, 1], [0, 1, 5]].
RUBRIC_SCRIPT: list[tuple[str, str]] = (
    [("compliant", "compliant")] * 7
    + [("compliant", "minor_deviation")]
    + [("minor_deviation", "compliant")]
    + [("minor_deviation", "minor_deviation")] * 4
    + [("minor_deviation", "violation")]
    + [("violation", "minor_deviation")]
    + [("violation", "violation")] * 5
)
RUBRIC_MATRIX = [[7, 1, 0], [1, 4, 1], [0, 1, 5]]
# Diagonal 16/20; row and column totals 8, 6, 6: p_e = (64 + 36 + 36) / 400 = 0.34; unweighted kappa 0.46 / 0.66.
RUBRIC_KAPPA = 0.46 / 0.66
_RUBRIC_TOKEN = re.compile(r"\[r(\d+)\]")


def write_refund_rubric(path: Path) -> Path:
    path.write_text(
        "name: refund_policy\nversion: 1\ninstructions: Did the agent keep to the refund policy?\nlabels:\n"
        "  - {name: compliant, weight: 1.0}\n  - {name: minor_deviation, weight: 0.5}\n"
        "  - {name: violation, weight: 0.0}\n",
        encoding="utf-8",
    )
    return path


def test_calibrate_a_rubric_file_judge_over_http(
    tmp_path: Path, judge_server: JudgeServer, capsys: pytest.CaptureFixture[str]
) -> None:
    """`calibrate --judge-file F --dataset FILE`: a gold set labelled for the file's judge, judged over HTTP by the
    scripted server, reports that judge's agreement (unweighted kappa, per label); the built-ins have no labels
    here and are not called."""
    rubric = write_refund_rubric(tmp_path / "refund_policy.yaml")
    dataset = tmp_path / "gold.jsonl"
    dataset.write_text(
        "".join(
            json.dumps(
                {
                    "id": f"r{n}",
                    "turns": [{"user": f"[r{n}] Can I get a refund?", "assistant": "Once the return is scanned."}],
                    "labels": {"refund_policy": gold},
                }
            )
            + "\n"
            for n, (gold, _) in enumerate(RUBRIC_SCRIPT)
        ),
        encoding="utf-8",
    )

    def respond(request: dict[str, Any]) -> Reply:
        assert metric_of(request) == "refund_policy"
        token = _RUBRIC_TOKEN.search(conversation_text(request))
        assert token is not None
        return verdict(RUBRIC_SCRIPT[int(token.group(1))][1])

    judge_server.responder = respond
    out = tmp_path / "report.json"
    argv = ["calibrate", "--judge-file", str(rubric), "--dataset", str(dataset), "--judge-model", "scripted-judge"]
    assert main([*argv, "--judge-retries", "0", "--output", str(out)]) == 0
    report = json.loads(out.read_text())
    assert list(report["metrics"]) == ["failure_rate", "conversational_flow", "refund_policy"]
    assert report["metrics"]["failure_rate"]["labelled"] == report["metrics"]["conversational_flow"]["labelled"] == 0
    figures = report["metrics"]["refund_policy"]
    assert figures["labels"] == ["compliant", "minor_deviation", "violation"]
    assert figures["confusion_matrix"] == RUBRIC_MATRIX
    assert (figures["n"], figures["judge_failures"]) == (20, 0)
    assert figures["accuracy"] == pytest.approx(16 / 20)
    assert figures["kappa"] == pytest.approx(RUBRIC_KAPPA)
    assert figures["kappa_weighting"] == "unweighted"
    assert figures["per_label"]["violation"] == {
        "gold": 6,
        "judge": 6,
        "agreed": 5,
        "recall": pytest.approx(5 / 6),
        "precision": pytest.approx(5 / 6),
    }
    assert figures["per_label"]["compliant"]["recall"] == pytest.approx(7 / 8)
    assert str(figures["rubric_version"]).startswith("refund_policy")
    assert len(judge_server.requests) == 20
    assert "refund_policy" in capsys.readouterr().out
    # The gate reads the file judge's figures; without --judge-file its labels are unknown: one line, exit 2.
    assert main([*argv, "--judge-retries", "0", "--min-kappa", "0.7"]) == 1
    capsys.readouterr()
    assert main(["calibrate", "--dataset", str(dataset), "--judge-model", "scripted-judge"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "unknown metric 'refund_policy'" in err, err
