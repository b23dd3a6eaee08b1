"""Spans → conversations: assembly, completion and identity as a state machine that knows nothing of Kafka."""
