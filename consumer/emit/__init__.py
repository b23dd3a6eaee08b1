"""Where verdicts go: Prometheus, OpenTelemetry (spans and events), the results topic."""
