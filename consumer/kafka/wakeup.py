"""A work-around of kafka-python's producer (any broker): its sender's wake-ups held for one round of the caller.

kafka-python (3.0.12) wakes its sender thread each time a send opens or fills a batch: a byte down a socket pair, a
system call that gives up the GIL, and a round of the sender's loop in Python while the stream thread waits to get
the GIL back. That was a tenth of the stream thread's time (with the sender's extra rounds on top).
`DeferredWakeup` holds those wake-ups while the stream thread sends and gives the sender one per round of the stream
thread (`wake`, at the end of `Assembler.step`), as Kafka Streams' producer sends without waiting: a record waits at
most one round (and `flush` wakes the sender at once), or until `WAKE_EVERY` wake-ups were held (a large burst
goes out while it is being written). A send to a topic whose metadata the producer lacks is not deferred: its send
waits on a metadata answer that needs the sender awake.

Without it the stream thread spends a tenth of its time waking the sender (bench/consumer_ingest.py); it reaches into
the producer's `_sender` and `_metadata`, hence the `kafka-python<3.1` pin, and leaves a producer without them alone.
"""

from __future__ import annotations

import threading
from typing import Any

WAKE_EVERY = 32  # wake-ups held at most before the sender is woken anyway (32 full batches: 8 MiB)


class DeferredWakeup:
    """Installed on one KafkaProducer's sender: the wake-ups its sends ask for on the stream thread are held until
    `wake` (see the module's docstring); every other wake-up (flush, close, a metadata wait) goes through at once."""

    def __init__(self, producer: Any) -> None:
        self.producer = producer
        self._metadata = producer._metadata
        self._sender = producer._sender
        self._wakeup = self._sender.wakeup
        self._sending: tuple[int, str] | None = None  # (thread, topic) of the send in progress
        self.held = 0  # wake-ups held since the sender last was woken
        self._sender.wakeup = self._asked

    @classmethod
    def install(cls, producer: Any) -> DeferredWakeup | None:
        """None for a producer without kafka-python's sender and metadata (e.g. a fake): left alone."""
        sender, metadata = getattr(producer, "_sender", None), getattr(producer, "_metadata", None)
        if not callable(getattr(sender, "wakeup", None)):
            return None
        if not callable(getattr(metadata, "partitions_for_topic", None)):
            return None
        return cls(producer)

    def send(self, topic: str, **kwargs: Any) -> Any:
        """The producer's `send`, its wake-ups held."""
        self._sending = (threading.get_ident(), topic)
        try:
            return self.producer.send(topic, **kwargs)
        finally:
            self._sending = None
            if self.held >= WAKE_EVERY:
                self.wake()

    def _asked(self) -> None:
        sending = self._sending
        if (
            sending is not None
            and sending[0] == threading.get_ident()
            and self._metadata.partitions_for_topic(sending[1]) is not None
        ):
            self.held += 1
        else:
            self.held = 0  # woken now: for those held too
            self._wakeup()

    def wake(self) -> None:
        """The sender wakes for the wake-ups held (if any)."""
        if self.held:
            self.held = 0
            self._wakeup()
