"""The alert reaches a human: consumer → Prometheus 2.42 (the shipped rules, only windows and `for:` shortened) →
Alertmanager (the shipped config, receivers pointed at a webhook this test runs on 127.0.0.1, timings shortened).

A hallucination burst of one agent is exactly one firing notification for that agent, carrying a summary, the share
and a dashboard link for that agent; an honest agent's burst notifies nobody; the end of the burst is a resolved
notification."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import threading
import time
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import yaml

from tests.conftest import missing_part
from tests.consumer.test_pipeline import scripted_judge
from tests.deploy.test_deploy_files import DEPLOY
from tests.deploy.test_prometheus_live import start_prometheus
from tests.support.judge_server import JudgeServer
from tests.support.pipeline import RunningConsumer, consumer_settings, play, traced_app, wait_for
from tracejudge.consumer.embedded_broker import EmbeddedBroker, free_port

SPIKE = "TracejudgeHallucinationSpike"
WINDOW = "30s"  # the shipped 10m; long enough for a burst judged on a loaded machine to count 20 in it
FOR = "2s"  # the shipped 5m


class Webhook:
    """The human: an HTTP receiver on 127.0.0.1 recording every Alertmanager notification."""

    def __init__(self) -> None:
        self.notifications: list[dict[str, Any]] = []
        self.lock = threading.Lock()
        webhook = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers.get("content-length") or 0)))
                with webhook.lock:
                    webhook.notifications.append(body)
                self.send_response(200)
                self.send_header("content-length", "0")
                self.end_headers()

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/alerts"

    def received(self) -> list[dict[str, Any]]:
        with self.lock:
            return list(self.notifications)

    def __enter__(self) -> Webhook:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()


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


def start_alertmanager(tmp: Path, webhook_url: str) -> tuple[subprocess.Popen, str]:
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
    port = free_port()
    process = subprocess.Popen(
        [
            binary,
            f"--config.file={tmp / 'alertmanager.yml'}",
            f"--storage.path={tmp / 'am-data'}",
            f"--web.listen-address=127.0.0.1:{port}",
            "--cluster.listen-address=",  # no gossip port: a single local instance
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

    wait_for(ready, timeout=30, what="Alertmanager ready")
    return process, f"127.0.0.1:{port}"


def alerts_of(notifications: list[dict[str, Any]]) -> list[tuple[str, dict[str, Any]]]:
    return [(n["status"], a) for n in notifications for a in n["alerts"]]


def test_spike_notifies_once_then_resolves(
    broker: EmbeddedBroker, topic: str, judge_server: JudgeServer, tmp_path: Path
) -> None:
    judge_server.responder = scripted_judge
    provider = traced_app(broker.bootstrap_servers, topic)
    settings = consumer_settings(broker.bootstrap_servers, topic, metrics="failure_rate")
    started = time.monotonic()
    processes: list[subprocess.Popen] = []
    with Webhook() as human, RunningConsumer(settings) as consumer:
        try:
            alertmanager, am_address = start_alertmanager(tmp_path, human.url)
            processes.append(alertmanager)
            url = consumer.app.metrics_url
            assert url is not None
            prometheus, _ = start_prometheus(
                tmp_path,
                url.removeprefix("http://").removesuffix("/metrics"),
                adapt_rules=shorten_spike,
                alertmanager=am_address,
            )
            processes.append(prometheus)
            # Each agent appears once before its burst, so its counters exist at their starting values.
            play(provider, {"warm-spiky": [("hello", "hi")]}, agent="spiky-bot")
            play(provider, {"warm-honest": [("hello", "hi")]}, agent="honest-bot")
            wait_for(lambda: consumer.sessions("judged") == 2, what="warm-up judged")
            time.sleep(3)
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
        finally:
            for process in processes:
                process.terminate()
                process.wait(10)
    provider.shutdown()
