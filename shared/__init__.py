"""What the tracer, the judges and the consumer share that is not tracing: the error root, bounded text, a
rate-limited log, Kafka client options and the PII redactor. Private: import it only from tracejudge's own packages
(a traced application gets the redactor as `tracejudge.tracer.redact`)."""
