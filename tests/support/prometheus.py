"""A real Prometheus 2.42 (and the servers of its family) on loopback for the live deploy tests."""

from __future__ import annotations

import json
import subprocess
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import yaml
from opentelemetry.sdk.trace import TracerProvider

from tests.conftest import require_binary
from tests.support.pipeline import RunningConsumer, play, wait_for
from tracejudge.consumer.embedded_broker import free_port

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"


def api(base: str, path: str, **params: str) -> Any:
    """The `data` of a successful Prometheus HTTP API answer."""
    url = f"{base}{path}?{urllib.parse.urlencode(params)}" if params else f"{base}{path}"
    with urllib.request.urlopen(url, timeout=10) as response:
        body = json.loads(response.read())
    assert body["status"] == "success", body
    return body["data"]


@contextmanager
def ready_server(what: str, command: list[str]) -> Iterator[str]:
    """Runs `command` listening on a free 127.0.0.1 port until its `/-/ready` answers (Prometheus, Alertmanager);
    yields host:port and stops the process on exit."""
    port = free_port()
    address = f"127.0.0.1:{port}"
    process = subprocess.Popen(
        [*command, f"--web.listen-address={address}"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )

    def ready() -> bool:
        try:
            return urllib.request.urlopen(f"http://{address}/-/ready", timeout=1).status == 200
        except OSError:
            return False

    try:
        wait_for(ready, timeout=30, what=f"{what} ready")
        yield address
    finally:
        process.terminate()
        process.wait(10)


@contextmanager
def running_prometheus(
    tmp: Path,
    metrics_url: str | None,
    *,
    adapt_rules: Callable[[dict[str, Any]], None] | None = None,
    alertmanager: str | None = None,
) -> Iterator[str]:
    """Prometheus 2.42 scraping `metrics_url` every second with the shipped rules (evaluated every second;
    `adapt_rules` may shorten windows and `for:`), exemplar storage on as in compose, optionally sending alerts to
    `alertmanager` (host:port). Yields its base URL."""
    binary = require_binary("prometheus")
    assert metrics_url is not None
    target = metrics_url.removeprefix("http://").removesuffix("/metrics")
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
    command = [
        binary,
        f"--config.file={tmp / 'prometheus.yml'}",
        f"--storage.tsdb.path={tmp / 'data'}",
        "--enable-feature=exemplar-storage",
    ]
    with ready_server("Prometheus", command) as address:
        yield f"http://{address}"


def warm_up(provider: TracerProvider, consumer: RunningConsumer, prometheus: str, *agents: str) -> None:
    """One conversation of each agent judged and scraped by `prometheus` (its base URL) before its burst, so its
    counters exist there at their starting values (a rate sees an increase only from a first sample on)."""
    for agent in agents:
        play(provider, {f"warm-{agent}": [("hello", "hi")]}, agent=agent)
    wait_for(lambda: consumer.sessions("judged") == len(agents), what="warm-up judged")

    def scraped() -> bool:
        query = 'count by (agent) (tracejudge_verdicts_total{metric="failure_rate"})'
        found = {r["metric"].get("agent") for r in api(prometheus, "/api/v1/query", query=query)["result"]}
        return set(agents) <= found

    wait_for(scraped, timeout=60, what="the warm-up verdicts scraped by Prometheus")
