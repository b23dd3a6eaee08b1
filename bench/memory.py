"""RSS per open conversation at 10,000 and 100,000 open conversations in the live state table (each in a fresh
process)."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

_PROBE = r"""
import gc, json, sys
from tracejudge.consumer.adapters import ConversationEvent, Turn
from tracejudge.consumer.conversation.table import ConversationTable

def rss() -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS")

count, turns = int(sys.argv[1]), int(sys.argv[2])
table = ConversationTable(idle_timeout_s=3600)
gc.collect()
before = rss()
for c in range(count):
    cid = f"conversation-{c:08d}"
    for t in range(turns):
        turn = Turn(f"{c:08x}{t:08x}", f"{c:032x}", "", t, t + 1,
                    f"user question number {t} about my order " * 3, "assistant answer with some detail " * 6, index=t)
        table.apply(ConversationEvent(cid, "support-bot", turn), 0)
gc.collect()
print(json.dumps({"open": table.open_count, "bytes": rss() - before}))
"""


def measure(count: int, turns: int) -> dict[str, Any]:
    completed = subprocess.run(
        [sys.executable, "-c", _PROBE, str(count), str(turns)], capture_output=True, text=True, check=True
    )
    data = json.loads(completed.stdout)
    return {
        "open_conversations": data["open"],
        "turns_each": turns,
        "rss_bytes": data["bytes"],
        "bytes_per_conversation": data["bytes"] / data["open"],
    }


def run() -> dict[str, Any]:
    return {f"{count}x{turns}": measure(count, turns) for count in (10_000, 100_000) for turns in (1, 5)}


if __name__ == "__main__":
    print(json.dumps(run(), indent=2))
