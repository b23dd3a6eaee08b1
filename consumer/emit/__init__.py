"""Where verdicts go: Prometheus, OpenTelemetry (spans and events), the results topic."""

from ._kafka_writer import KafkaWriter

__all__ = ["KafkaWriter"]
