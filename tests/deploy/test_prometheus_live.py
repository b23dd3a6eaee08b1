"""A real Prometheus 2.42 scrapes a real consumer (Tansu + local judge) every second with the alert rules loaded."""

from __future__ import annotations

import json
import subprocess
import time
import urllib.parse
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from tests.conftest import require_binary
from tests.consumer.test_pipeline import scripted_judge
from tests.deploy.test_deploy_files import DEPLOY, dashboard_exprs
from tests.support.judge_server import JudgeServer, Reply, conversation_text
from tests.support.pipeline import RunningConsumer, consumer_settings, play, traced_app, wait_for
from tracejudge.consumer.embedded_broker import EmbeddedBroker, free_port
from tracejudge.tracer import record_feedback


def api(base: str, path: str, **params: str) -> Any:
    url = f"{base}{path}?{urllib.parse.urlencode(params)}" if params else f"{base}{path}"
    with urllib.request.urlopen(url, timeout=10) as response:
        body = json.loads(response.read())
    assert body["status"] == "success", body
    return body["data"]


def start_prometheus(
    tmp: Path,
    target: str,
    *,
    adapt_rules: Callable[[dict[str, Any]], None] | None = None,
    alertmanager: str | None = None,
) -> tuple[subprocess.Popen, str]:
    """Prometheus 2.42 with the shipped rules (evaluated every second; `adapt_rules` may shorten windows and `for:`),
    exemplar storage on as in compose, optionally sending alerts to `alertmanager` (host:port)."""
    binary = require_binary("prometheus")
    rules = yaml.safe_load((DEPLOY / "prometheus" / "alerts.yml").read_text())
    for group in rules["groups"]:
        group["interval"] = "1s"  # the test copy only evaluates faster; expressions and `for:` are unchanged
    if adapt_rules is not None:
        adapt_rules(rules)
    (tmp / "alerts.yml").write_text(yaml.safe_dump(rules))
    config: dict[str, Any] = {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "rule_files": ["alerts.yml"],
        "scrape_configs": [{"job_name": "tracejudge", "static_configs": [{"targets": [target]}]}],
    }
    if alertmanager is not None:
        config["alerting"] = {"alertmanagers": [{"static_configs": [{"targets": [alertmanager]}]}]}
    (tmp / "prometheus.yml").write_text(yaml.safe_dump(config))
    port = free_port()
    process = subprocess.Popen(
        [
            binary,
            f"--config.file={tmp / 'prometheus.yml'}",
            f"--storage.tsdb.path={tmp / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}",
            "--enable-feature=exemplar-storage",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    base = f"http://127.0.0.1:{port}"

    def ready() -> bool:
        try:
            return urllib.request.urlopen(f"{base}/-/ready", timeout=1).status == 200
        except OSError:
            return False

    wait_for(ready, timeout=30, what="Prometheus ready")
    return process, base


def judge_with_failures(request: dict) -> Reply:
    if "flaky" in conversation_text(request):
        return Reply(content="no verdict today")
    return scripted_judge(request)


def test_prometheus_scrapes_alerts_and_dashboard_queries(
    broker: EmbeddedBroker, topic: str, judge_server: JudgeServer, tmp_path: Path
) -> None:
    judge_server.responder = judge_with_failures
    provider = traced_app(broker.bootstrap_servers, topic)
    settings = consumer_settings(broker.bootstrap_servers, topic)
    with RunningConsumer(settings) as consumer:
        url = consumer.app.metrics_url
        assert url is not None
        target = url.removeprefix("http://").removesuffix("/metrics")
        process, base = start_prometheus(tmp_path, target)
        try:
            # Each agent appears once before its burst, so its counters exist at their starting values.
            play(provider, {"warm-spiky": [("hello", "hi")]}, agent="spiky-bot")
            play(provider, {"warm-honest": [("hello", "hi")]}, agent="honest-bot")
            wait_for(lambda: consumer.sessions("judged") == 2, what="warm-up judged")
            time.sleep(3)
            play(provider, {f"spike-{i}": [(f"spike {i}", "INVENTED figure")] for i in range(40)}, agent="spiky-bot")
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

            def spike_alert() -> list[dict]:
                alerts = api(base, "/api/v1/alerts")["alerts"]
                return [a for a in alerts if a["labels"]["alertname"] == "TracejudgeHallucinationSpike"]

            wait_for(lambda: bool(spike_alert()), timeout=60, what="TracejudgeHallucinationSpike pending or firing")
            time.sleep(3)
            alerts = spike_alert()
            assert {a["labels"]["agent"] for a in alerts} == {"spiky-bot"}
            assert alerts[0]["state"] in ("pending", "firing")

            def all_queries_have_data() -> list[str]:
                empty = []
                for expr in dashboard_exprs():
                    if "tracejudge_hallucination_rate_corrected" in expr:
                        continue  # exported only with --calibration (tests/consumer/test_calibrate*.py)
                    concrete = expr.replace("$agent", ".*").replace("$__rate_interval", "1m")
                    if not api(base, "/api/v1/query", query=concrete)["result"]:
                        empty.append(concrete)
                return empty

            try:
                wait_for(lambda: not all_queries_have_data(), timeout=60, what="every dashboard query returning data")
            except AssertionError as exc:
                raise AssertionError(f"{exc}: still empty: {all_queries_have_data()}") from None
            hallucination = api(base, "/api/v1/query", query='tracejudge_hallucination_rate{agent="spiky-bot"}')
            assert float(hallucination["result"][0]["value"][1]) > 0.9
        finally:
            process.terminate()
            process.wait(10)
    provider.shutdown()
