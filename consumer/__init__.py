"""The tracejudge consumer service: Kafka spans in, judged conversations out."""
