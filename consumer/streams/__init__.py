"""The Kafka runtime, shaped as Kafka Streams: a repartition topic routes spans to their conversation's owner, a
compacted changelog makes each partition's conversations durable and restorable, and a judge-queue topic carries
completed conversations to the judge workers, so a slow judge is Kafka lag, not memory."""
