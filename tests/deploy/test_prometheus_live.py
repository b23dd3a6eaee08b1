"""A real Prometheus 2.42 scrapes a real consumer (Tansu + local judge) every second with the alert rules loaded."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

import tests.support.judge_server as judge_server_module
from tests.consumer.test_pipeline import scripted_judge
from tests.deploy.test_deploy_files import concrete, dashboard_exprs
from tests.support.judge_server import JudgeServer, Reply, conversation_text
from tests.support.pipeline import RunningConsumer, consumer_settings, play, traced_app, wait_for
from tests.support.prometheus import api, running_prometheus, warm_up
from tracejudge.consumer.embedded_broker import EmbeddedBroker
from tracejudge.tracer import record_feedback

# A team's rubric file judged beside the built-ins, with a label to alert on: the dashboard's per-judge row and
# TracejudgeRubricVerdictShareHigh see it without editing either.
REFUND_POLICY: dict[str, Any] = {
    "name": "refund_policy",
    "version": 1,
    "instructions": "REFUND-POLICY-RUBRIC: did the agent keep to the refund policy?",
    "labels": [
        {"name": "compliant", "weight": 1.0},
        {"name": "violation", "weight": 0.0, "alert_share": 0.5},
    ],
}
# A team's failure-mode taxonomy for the built-in judge, one mode opted into TracejudgeFailureModeShareHigh: the
# dashboard's "what the failures are about" panel draws the modes and the threshold.
FAILURE_MODES: dict[str, Any] = {
    "failure_rate": [
        {"name": "invented_figures", "description": "a number the sources do not give", "alert_share": 0.5},
        {"name": "invented_policies", "description": "a rule or term the company does not have"},
    ]
}


def judge_with_failures(request: dict) -> Reply:
    text = conversation_text(request)
    if "flaky" in text:
        return Reply(content="no verdict today")
    if judge_server_module.metric_of(request) == "refund_policy":
        verdict = "violation" if "INVENTED" in text else "compliant"
        return Reply(content=json.dumps({"verdict": verdict, "evidence": ["turn 1"], "reason": "scripted"}))
    reply = scripted_judge(request)
    answer = json.loads(reply.content or "{}")
    if judge_server_module.metric_of(request) == "failure_rate" and answer["verdict"] == "hallucination":
        # Three in four of spiky-bot's hallucinations invent a figure, the rest a policy.
        answer["failure_mode"] = "invented_policies" if "POLICY" in text else "invented_figures"
        return Reply(content=json.dumps(answer))
    return reply


# alert rules evaluated each second against windows and `for:` of seconds: alone
@pytest.mark.serial
def test_prometheus_scrapes_alerts_and_dashboard_queries(
    broker: EmbeddedBroker, topic: str, judge_server: JudgeServer, tmp_path: Path
) -> None:
    judge_server.responder = judge_with_failures
    provider = traced_app(broker.bootstrap_servers, topic)
    rubric = tmp_path / "refund_policy.json"  # JSON is YAML
    rubric.write_text(json.dumps(REFUND_POLICY))
    modes = tmp_path / "failure_modes.json"
    modes.write_text(json.dumps(FAILURE_MODES))
    # The canary and a shadow judge run too, so the dashboard's judge-watch panels have data to show.
    settings = consumer_settings(
        broker.bootstrap_servers,
        topic,
        canary_interval="5s",
        canary_accuracy_floor=0.5,
        shadow_judge_model="gpt-4.1-mini",
        shadow_sample_rate=0.2,
        judge_files=[str(rubric)],
        failure_modes=str(modes),
    )
    with RunningConsumer(settings) as consumer:
        with running_prometheus(tmp_path, consumer.app.metrics_url) as base:
            warm_up(provider, consumer, base, "spiky-bot", "honest-bot")
            spikes = {
                f"spike-{i}": [(f"spike {i}", "INVENTED POLICY" if i % 4 == 0 else "INVENTED figure")]
                for i in range(40)
            }
            play(provider, spikes, agent="spiky-bot")
            play(provider, {f"calm-{i}": [(f"calm {i}", "I am not sure.")] for i in range(40)}, agent="honest-bot")
            play(provider, {f"flaky-{i}": [(f"flaky {i}", "ok")] for i in range(3)}, agent="flaky-bot")
            for i in range(5):  # users disagree with the honest verdicts and agree with the hallucination ones
                record_feedback(f"calm-{i}", label="thumbs_down", agent="honest-bot", tracer_provider=provider)
                record_feedback(f"spike-{i}", score=-1.0, agent="spiky-bot", tracer_provider=provider)
            provider.force_flush()
            wait_for(lambda: consumer.sessions() == 85, timeout=120, what="all 85 conversations accounted")
            wait_for(
                lambda: consumer.value("tracejudge_feedback_total", agent="honest-bot", feedback="negative") == 5,
                what="feedback counted",
            )

            def active(alertname: str) -> list[dict]:
                alerts = api(base, "/api/v1/alerts")["alerts"]
                return [a for a in alerts if a["labels"]["alertname"] == alertname]

            wait_for(
                lambda: bool(active("TracejudgeHallucinationSpike")),
                timeout=60,
                what="TracejudgeHallucinationSpike pending or firing",
            )
            wait_for(
                lambda: bool(active("TracejudgeRubricVerdictShareHigh")),
                timeout=60,
                what="TracejudgeRubricVerdictShareHigh pending or firing",
            )
            wait_for(
                lambda: bool(active("TracejudgeFailureModeShareHigh")),
                timeout=60,
                what="TracejudgeFailureModeShareHigh pending or firing",
            )
            time.sleep(3)
            alerts = active("TracejudgeHallucinationSpike")
            assert {a["labels"]["agent"] for a in alerts} == {"spiky-bot"}
            assert alerts[0]["state"] in ("pending", "firing")
            # The rubric's violation share is 40/41 for spiky-bot, 0 for honest-bot; the built-ins' verdicts (100%
            # hallucination for spiky-bot) have no alert_share and never raise it.
            rubric_alerts = active("TracejudgeRubricVerdictShareHigh")
            assert {(a["labels"]["agent"], a["labels"]["metric"], a["labels"]["verdict"]) for a in rubric_alerts} == {
                ("spiky-bot", "refund_policy", "violation")
            }
            assert "above the rubric's alert_share of 50%" in rubric_alerts[0]["annotations"]["description"]
            # spiky-bot's 40 hallucinations: 30 invented_figures (75%, above its 0.5), 10 invented_policies (no
            # threshold); no `other`, so TracejudgeFailureModeOtherHigh stays quiet.
            mode_alerts = active("TracejudgeFailureModeShareHigh")
            assert {(a["labels"]["agent"], a["labels"]["metric"], a["labels"]["mode"]) for a in mode_alerts} == {
                ("spiky-bot", "failure_rate", "invented_figures")
            }
            assert not active("TracejudgeFailureModeOtherHigh")
            shares = api(
                base,
                "/api/v1/query",
                query='agent_metric_mode:tracejudge_failure_mode_share:ratio1h{agent="spiky-bot",metric="failure_rate"}',
            )["result"]
            by_mode = {r["metric"]["mode"]: float(r["value"][1]) for r in shares}
            assert by_mode["invented_figures"] == pytest.approx(0.75) and by_mode["invented_policies"] == pytest.approx(
                0.25
            )
            assert by_mode.get("other", 0.0) == 0.0

            def all_queries_have_data() -> list[str]:
                empty = []
                for expr in dashboard_exprs():
                    if "tracejudge_hallucination_rate_corrected" in expr:
                        continue  # exported only with --calibration (tests/consumer/test_calibrate*.py)
                    if not api(base, "/api/v1/query", query=concrete(expr))["result"]:
                        empty.append(concrete(expr))
                return empty

            try:
                wait_for(lambda: not all_queries_have_data(), timeout=60, what="every dashboard query returning data")
            except AssertionError as exc:
                raise AssertionError(f"{exc}: still empty: {all_queries_have_data()}") from None
            hallucination = api(base, "/api/v1/query", query='tracejudge_hallucination_rate{agent="spiky-bot"}')
            assert float(hallucination["result"][0]["value"][1]) > 0.9
            # The dashboard's judge variable lists the rubric file's judge beside the built-ins: its row repeats.
            judges = api(base, "/api/v1/label/metric/values", **{"match[]": "tracejudge_verdicts_total"})
            assert {"failure_rate", "conversational_flow", "refund_policy"} <= set(judges)
    provider.shutdown()
