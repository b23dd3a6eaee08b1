"""SASL and SSL options pass through to kafka-python for the exporter and the consumer; wrong ones fail clearly."""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from tracejudge.consumer.emit.prometheus import ConsumerInstruments
from tracejudge.consumer.service import ConsumerService
from tracejudge.consumer.settings import Settings
from tracejudge.tracer import KafkaSpanExporter

SASL = {
    "security_protocol": "SASL_SSL",
    "sasl_mechanism": "SCRAM-SHA-512",
    "sasl_plain_username": "svc",
    "sasl_plain_password": "secret",
    "ssl_check_hostname": True,
}


def test_exporter_passes_security_options_through() -> None:
    exporter = KafkaSpanExporter("broker:9093", **SASL)
    for key, value in SASL.items():
        assert exporter.producer_config[key] == value


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"security_protocol": "TLS"}, "security_protocol 'TLS'"),
        ({"security_protocol": "SASL_SSL"}, "needs sasl_mechanism"),
        ({"security_protocol": "SASL_SSL", "sasl_mechanism": "MD5"}, "sasl_mechanism 'MD5'"),
        ({"security_protocol": "SASL_PLAINTEXT", "sasl_mechanism": "PLAIN"}, "needs sasl_plain_username"),
        ({"security_protocol": "SSL", "ssl_cafile": "/nonexistent/ca.pem"}, "ssl_cafile"),
        ({"sasl_mechansim": "PLAIN"}, "unknown Kafka client option"),
    ],
)
def test_wrong_settings_fail_clearly(options: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        KafkaSpanExporter("broker:9093", **options)


def test_consumer_passes_security_options_to_kafka_python() -> None:
    captured: dict[str, Any] = {}

    class Captured(Exception):
        pass

    def factory(**config: Any) -> Any:
        captured.update(config)
        raise Captured

    settings = Settings.from_options(kafka_config=[f"{k}={v}" for k, v in SASL.items()])
    service = ConsumerService(settings, [], ConsumerInstruments(CollectorRegistry()), consumer_factory=factory)
    with pytest.raises(Captured):
        service.run()
    for key, value in SASL.items():
        assert captured[key] == value
    assert captured["enable_auto_commit"] is False


def test_consumer_cli_rejects_a_wrong_setting_before_connecting() -> None:
    completed = subprocess.run(
        [sys.executable, "-m", "tracejudge.consumer", "--kafka-config", "security_protocol=SASL_SSL"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert completed.returncode == 2
    assert "needs sasl_mechanism" in completed.stderr and completed.stderr.count("\n") == 1
