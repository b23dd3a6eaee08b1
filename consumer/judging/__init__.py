"""Judging a completed conversation: which to judge (sampling), the judge pool that runs the judges, what a
judgement came to (a value), its result record, the durable-retry decision, the feedback join, the fan-out to the
outputs, and the canary over a labelled gold set. Below the runtime (streams/) that drives it, above the
conversation layer whose jobs it judges; the outputs (emit/) read its values."""
