"""The alert reaches a human: consumer → Prometheus 2.42 (the shipped rules, only windows and `for:` shortened) →
Alertmanager (the shipped config, receivers pointed at a webhook this test runs on 127.0.0.1, timings shortened).

A hallucination burst of one agent is exactly one firing notification for that agent, carrying a summary, the share
and a dashboard link for that agent; an honest agent's burst notifies nobody; the end of the burst is a resolved
notification."""

from __future__ import annotations

import json
import re
import shutil
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.conftest import missing_part
from tests.consumer.test_pipeline import scripted_judge
from tests.support.judge_server import JudgeServer
from tests.support.loopback import LoopbackHTTPServer, QuietHandler
from tests.support.pipeline import RunningConsumer, consumer_settings, play, traced_app, wait_for
from tests.support.prometheus import DEPLOY, ready_server, running_prometheus, warm_up
from tracejudge.consumer.embedded_broker import EmbeddedBroker

SPIKE = "TracejudgeHallucinationSpike"
WINDOW = "30s"  # the shipped 10m; long enough for a burst judged on a loaded machine to count 20 in it
FOR = "2s"  # the shipped 5m


class Webhook:
    """The human: an HTTP receiver on 127.0.0.1 recording every Alertmanager notification."""

    def __init__(self) -> None:
        self.notifications: list[dict[str, Any]] = []
        self.lock = threading.Lock()
        webhook = self

        class Handler(QuietHandler):
            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers.get("content-length") or 0)))
                with webhook.lock:
                    webhook.notifications.append(body)
                self.send_response(200)
                self.send_header("content-length", "0")
                self.end_headers()

        self.http = LoopbackHTTPServer(Handler)

    @property
    def url(self) -> str:
        return f"{self.http.url}/alerts"

    def received(self) -> list[dict[str, Any]]:
        with self.lock:
            return list(self.notifications)

    def __enter__(self) -> Webhook:
        self.http.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.http.stop()


def shorten_spike(rules: dict[str, Any]) -> None:
    """Only the spike's windows (10m → 20s, the baseline's offset alike) and its `for:`; the rest as shipped."""
    shortened = 0
    for group in rules["groups"]:
        for rule in group["rules"]:
            if rule.get("record", "").startswith(
                "agent:tracejudge_hallucination"
            ) or "agent:tracejudge_failure" in rule.get("record", ""):
                expr = re.sub(r"\[10m\]", f"[{WINDOW}]", rule["expr"]).replace("offset 10m", f"offset {WINDOW}")
                shortened += expr != rule["expr"]
                rule["expr"] = expr
            if rule.get("alert") == SPIKE:
                assert rule["for"] == "5m", rule["for"]
                rule["for"] = FOR
    assert shortened == 3, "the shipped spike rules changed shape: adapt the test copy"


@contextmanager
def running_alertmanager(tmp: Path, webhook_url: str) -> Iterator[str]:
    """Alertmanager with the shipped config, every webhook pointed at `webhook_url`; yields its host:port."""
    binary = shutil.which("prometheus-alertmanager") or shutil.which("alertmanager")
    if binary is None:
        missing_part("Alertmanager (apt-get install -y prometheus-alertmanager)")
    assert binary is not None
    config = yaml.safe_load((DEPLOY / "alertmanager" / "alertmanager.yml").read_text())
    config["global"]["resolve_timeout"] = "10s"
    config["route"].update(group_wait="1s", group_interval="2s", repeat_interval="1h")
    for receiver in config["receivers"]:  # the shipped routes and receivers, every webhook pointed at the test
        for webhook in receiver.get("webhook_configs", []):
            webhook["url"] = webhook_url
    (tmp / "alertmanager.yml").write_text(yaml.safe_dump(config))
    command = [
        binary,
        f"--config.file={tmp / 'alertmanager.yml'}",
        f"--storage.path={tmp / 'am-data'}",
        "--cluster.listen-address=",  # no gossip port: a single local instance
    ]
    with ready_server("Alertmanager", command) as address:
        yield address


def alerts_of(notifications: list[dict[str, Any]]) -> list[tuple[str, dict[str, Any]]]:
    return [(n["status"], a) for n in notifications for a in n["alerts"]]


# alert rules evaluated each second against windows and `for:` of seconds: alone
@pytest.mark.serial
def test_spike_notifies_once_then_resolves(
    broker: EmbeddedBroker, topic: str, judge_server: JudgeServer, tmp_path: Path
) -> None:
    judge_server.responder = scripted_judge
    provider = traced_app(broker.bootstrap_servers, topic)
    settings = consumer_settings(broker.bootstrap_servers, topic, metrics="failure_rate")
    started = time.monotonic()
    with Webhook() as human, RunningConsumer(settings) as consumer:
        with (
            running_alertmanager(tmp_path, human.url) as alertmanager,
            running_prometheus(
                tmp_path, consumer.app.metrics_url, adapt_rules=shorten_spike, alertmanager=alertmanager
            ) as prometheus,
        ):
            warm_up(provider, consumer, prometheus, "spiky-bot", "honest-bot")
            # 30 > the rule's 20 in the window, so a slowly judged burst still clears it while it lasts.
            play(provider, {f"spike-{i}": [(f"spike {i}", "INVENTED figure")] for i in range(30)}, agent="spiky-bot")
            play(provider, {f"calm-{i}": [(f"calm {i}", "I am not sure.")] for i in range(25)}, agent="honest-bot")
            wait_for(lambda: consumer.sessions("judged") == 57, timeout=90, what="both bursts judged")
            burst_judged = time.monotonic()

            wait_for(lambda: bool(human.received()), timeout=90, what="a notification")
            fired = time.monotonic()
            time.sleep(3)  # more than group_interval: a duplicate would have arrived by now
            (notification,) = human.received()
            assert notification["status"] == "firing"
            ((_, alert),) = alerts_of([notification])
            assert alert["labels"]["alertname"] == SPIKE and alert["labels"]["agent"] == "spiky-bot"
            annotations = alert["annotations"]
            assert annotations["summary"] == "Hallucination spike for agent spiky-bot"
            share = float(annotations["hallucination_share"].rstrip("%"))
            assert 50 < share <= 100, annotations["hallucination_share"]
            assert annotations["dashboard"].endswith("/d/tracejudge/tracejudge?var-agent=spiky-bot")

            # The burst is over: the window empties, the alert resolves, the human hears so.
            wait_for(lambda: len(human.received()) >= 2, timeout=120, what="the resolved notification")
            resolved = time.monotonic()
            time.sleep(3)
            notifications = human.received()
            assert [n["status"] for n in notifications] == ["firing", "resolved"]
            assert [(s, a["labels"]["agent"], a["labels"]["alertname"]) for s, a in alerts_of(notifications)] == [
                ("firing", "spiky-bot", SPIKE),
                ("resolved", "spiky-bot", SPIKE),
            ]
            print(
                f"\nalert delivery: burst judged {burst_judged - started:.1f}s after start, firing notification "
                f"+{fired - burst_judged:.1f}s, resolved +{resolved - burst_judged:.1f}s"
            )
    provider.shutdown()
