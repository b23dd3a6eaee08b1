"""Which broker answers, so that a work-around only the embedded broker needs runs only there.

Tansu (the broker of the demo and the tests: `embedded_broker`) reports the cluster id `tansu_cluster` unless started
with another `--kafka-cluster-id`; a cluster whose id does not start with `tansu` never takes a Tansu path. The
client's own work-arounds (kafka-python's, needed on any broker) do not ask."""

from __future__ import annotations

from typing import Any

TANSU_CLUSTER_PREFIX = "tansu"


def cluster_id(client: Any) -> str | None:
    """The cluster id the brokers reported to a kafka-python consumer or producer (None before they answered)."""
    cluster = getattr(getattr(client, "_client", None), "cluster", None)
    value = getattr(cluster, "cluster_id", None)
    return value if isinstance(value, str) else None


def is_tansu(client: Any) -> bool:
    """The client talks to Tansu (the embedded broker)."""
    found = cluster_id(client)
    return found is not None and found.lower().startswith(TANSU_CLUSTER_PREFIX)
