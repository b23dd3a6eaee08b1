"""The one place that talks to Kafka: clients built from the settings (`clients`), a topic read to its end
(`reader`), a compacted topic as a table (`table`), the internal topics (`topics`), and the client's and the embedded
broker's work-arounds, each named for what it works around (`workarounds`). Nothing outside this package imports
kafka-python; changing the client is this package's work.

The names the rest of the consumer needs from the client are re-exported here, so a module imports them from the
seam, never from `kafka`."""

from kafka import AsyncConsumerRebalanceListener as RebalanceListener
from kafka import KafkaConsumer, KafkaProducer, TopicPartition
from kafka.admin import KafkaAdminClient
from kafka.errors import KafkaError, KafkaTimeoutError
from kafka.structs import OffsetAndMetadata

from .clients import KafkaClients

__all__ = [
    "KafkaAdminClient",
    "KafkaClients",
    "KafkaConsumer",
    "KafkaError",
    "KafkaProducer",
    "KafkaTimeoutError",
    "OffsetAndMetadata",
    "RebalanceListener",
    "TopicPartition",
]
