"""TLS and SASL against the embedded broker, through every command: the exporter, `consume`, `backfill`, `compare`.

TLS: a CA made here with openssl signs the broker's certificate; Tansu 0.6.0 has no TLS listener of its own (it
loads --cert/--key and never uses them), so the embedded broker terminates TLS in front of it (embedded_broker.py).
SASL: Tansu's --authentication offers SCRAM-SHA-256/512 but no user can be created on its memory storage, so only a
refused login can be shown here; a successful SASL login is not tested (nor PLAIN, which this build does not offer).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor

from tests.consumer.test_pipeline import scripted_judge
from tests.support.judge_server import JudgeServer
from tests.support.pipeline import HEARTBEAT_MS, ROOT, SESSION_MS, consumer_process, play, read_records
from tracejudge.consumer.embedded_broker import EmbeddedBroker
from tracejudge.tracer import KafkaSpanExporter

EXIT_NOPERM = 77


def openssl(*args: str) -> None:
    subprocess.run(["openssl", *args], check=True, capture_output=True, timeout=60)


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A CA, the broker's certificate it signs (for 127.0.0.1), and another CA that signed nothing of ours."""
    home = tmp_path_factory.mktemp("pki")
    for ca in ("ca", "other"):
        openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", f"/CN=tracejudge test {ca}",
                "-keyout", str(home / f"{ca}.key"), "-out", str(home / f"{ca}.pem"))  # fmt: skip
    openssl("req", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=127.0.0.1",
            "-keyout", str(home / "broker.key"), "-out", str(home / "broker.csr"))  # fmt: skip
    (home / "san.ext").write_text("subjectAltName=IP:127.0.0.1\n")
    openssl("x509", "-req", "-in", str(home / "broker.csr"), "-CA", str(home / "ca.pem"), "-CAkey",
            str(home / "ca.key"), "-CAcreateserial", "-days", "2", "-extfile", str(home / "san.ext"),
            "-out", str(home / "broker.pem"))  # fmt: skip
    return home


@pytest.fixture(scope="module")
def tls_broker(pki: Path) -> Iterator[EmbeddedBroker]:
    with EmbeddedBroker(tls=(pki / "broker.pem", pki / "broker.key")) as broker:
        yield broker


@pytest.fixture(scope="module")
def sasl_broker() -> Iterator[EmbeddedBroker]:
    with EmbeddedBroker(authentication=True) as broker:
        yield broker


def tls(pki: Path, ca: str = "ca") -> dict[str, str]:
    return {"security_protocol": "SSL", "ssl_cafile": str(pki / f"{ca}.pem")}


def kafka_config(options: dict[str, str], **more: str) -> str:
    return ",".join(f"{k}={v}" for k, v in {**options, **more}.items())


def command(*args: str, options: dict[str, str]) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "COLUMNS": "200",
        "TRACEJUDGE_KAFKA_CONFIG": kafka_config(options, bootstrap_timeout_ms="5000"),
    }
    return subprocess.run(
        [sys.executable, "-m", "tracejudge.consumer", *args], capture_output=True, text=True, env=env, timeout=240
    )


def test_the_exporter_consume_backfill_and_compare_connect_over_tls(
    tls_broker: EmbeddedBroker, judge_server: JudgeServer, pki: Path, tmp_path: Path
) -> None:
    judge_server.responder = scripted_judge
    options = tls(pki)
    topic, group = f"tls-{uuid.uuid4().hex[:6]}", f"tls-{uuid.uuid4().hex[:6]}"
    results = f"{topic}-results"
    tls_broker.create_topic(topic, 1, **options)
    tls_broker.create_topic(results, 1, **options)
    started = time.time() - 5
    provider = TracerProvider(resource=Resource.create({"service.name": "tls-app"}))
    exporter = KafkaSpanExporter(tls_broker.bootstrap_servers, topic, **options)
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    play(provider, {"tls-1": [("is this encrypted?", "yes")]})
    assert exporter.stats.spans_dropped == 0 and exporter.stats.spans_exported > 0

    env = {
        "TRACEJUDGE_KAFKA_CONFIG": kafka_config(
            options, session_timeout_ms=str(SESSION_MS), heartbeat_interval_ms=str(HEARTBEAT_MS)
        )
    }
    process = consumer_process(tls_broker, topic, group, results, log=tmp_path / "consume.log", **env)
    try:
        records = read_records(tls_broker.bootstrap_servers, results, 1, timeout_s=120, **options)
    finally:
        process.terminate()
        process.wait(60)
    log = (tmp_path / "consume.log").read_text()
    assert [json.loads(r.value)["conversation_id"] for r in records] == ["tls-1"], log

    window = ("--from", str(started), "--to", str(time.time() + 5))
    backfill = command("backfill", "--dry-run", *window, "--bootstrap-servers", tls_broker.bootstrap_servers,
                       "--topic", topic, "--judge-model", "gpt-4o-mini", options=options)  # fmt: skip
    assert backfill.returncode == 0, backfill.stderr[-2000:]
    assert "would judge 1 conversation" in " ".join(backfill.stdout.split()), backfill.stdout
    output = str(tmp_path / "compare.json")
    compare = command("compare", *window, "--bootstrap-servers", tls_broker.bootstrap_servers,
                      "--results-topic", results, "--output", output, options=options)  # fmt: skip
    # It read the one result over TLS; with no shadow to pair it with, that is its usage error (exit 2).
    assert compare.returncode == 2 and "(1 records read)" in compare.stderr, compare.stderr[-2000:]
    provider.shutdown()


COMMANDS = {
    "consume": ("consume", "--topic", "t", "--group-id", "g"),
    "backfill": ("backfill", "--dry-run", "--from", "2026-11-01", "--to", "2026-11-02", "--topic", "t"),
    "compare": ("compare", "--from", "2026-11-01", "--to", "2026-11-02", "--results-topic", "r"),
}


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_a_ca_that_did_not_sign_the_brokers_certificate_is_one_line_and_exit_77(
    tls_broker: EmbeddedBroker, judge_server: JudgeServer, pki: Path, name: str
) -> None:
    completed = command(*COMMANDS[name], "--bootstrap-servers", tls_broker.bootstrap_servers, options=tls(pki, "other"))
    assert completed.returncode == EXIT_NOPERM, completed.stderr[-3000:]
    lines = completed.stderr.strip().splitlines()
    assert len(lines) == 1 and "TLS handshake failed" in lines[0] and "ssl_cafile" in lines[0], lines
    assert "CERTIFICATE_VERIFY_FAILED" in lines[0]


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_a_refused_sasl_login_is_one_line_and_exit_77(
    sasl_broker: EmbeddedBroker, judge_server: JudgeServer, name: str
) -> None:
    options = {
        "security_protocol": "SASL_PLAINTEXT",
        "sasl_mechanism": "SCRAM-SHA-512",
        "sasl_plain_username": "svc",
        "sasl_plain_password": "wrong",
    }
    completed = command(*COMMANDS[name], "--bootstrap-servers", sasl_broker.bootstrap_servers, options=options)
    assert completed.returncode == EXIT_NOPERM, completed.stderr[-3000:]
    lines = completed.stderr.strip().splitlines()
    assert len(lines) == 1 and "refused the SASL login (SCRAM-SHA-512 as 'svc')" in lines[0], lines
    assert "wrong" not in lines[0]  # the password is never echoed


def test_the_exporter_facing_an_untrusted_broker_drops_with_a_reason_and_never_raises(
    tls_broker: EmbeddedBroker, pki: Path
) -> None:
    exporter = KafkaSpanExporter(tls_broker.bootstrap_servers, "t", **tls(pki, "other"), bootstrap_timeout_ms=3000)
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    play(provider, {"untrusted": [("q", "a")]})  # returns: tracing never raises into the app
    assert exporter.stats.spans_exported == 0 and exporter.stats.spans_dropped > 0
    print(f"\nexporter, untrusted broker: {exporter.stats.last_error}")
    provider.shutdown()
