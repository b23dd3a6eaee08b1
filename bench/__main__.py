"""`make bench`: every benchmark side by side in one run; prints a table and writes bench/results.json."""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bench._stats import machine

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
RESULTS = Path(__file__).resolve().parent / "results.json"


def table(results: dict[str, Any]) -> str:
    rows = []
    tracer = results.get("tracer_overhead")
    if tracer:
        for name, figure in tracer["figures"].items():
            rows.append(
                (
                    "tracer overhead",
                    name,
                    f"{figure['median']:.1f} µs/call (min {figure['min']:.1f}, max {figure['max']:.1f})",
                    f"{tracer['ratio_to_hand_written'][name]:.2f}x hand-written",
                )
            )
    judge = results.get("judge_throughput")
    if judge:
        for name, figure in judge["figures"].items():
            ratio = judge["limit_s"] / figure["median"]
            rows.append(
                (
                    "judge throughput",
                    name,
                    f"{figure['median']:.2f} s for {judge['calls']} calls",
                    f"{ratio:.2f}x the limit",
                )
            )
        rows.append(("judge throughput", "LiteLLM+ours CPU per call", f"{judge['cpu_ms_per_call_total']:.2f} ms", ""))
        rows.append(
            (
                "judge throughput",
                "our own overhead per call",
                f"{judge['own_overhead_ms_per_call']:.3f} ms",
                "goal < 3 ms",
            )
        )
    ingest = results.get("consumer_ingest")
    if ingest:
        for label, row in ingest.get("per_record_us", {}).items():
            for stage in ("protobuf parse", "read_events"):
                rows.append(
                    (
                        f"one record, {label}",
                        stage,
                        f"{row[stage]:.1f} µs CPU",
                        f"{row[stage] / row['protobuf parse']:.1f}x the parse",
                    )
                )
        for keyed_by, row in ingest["inputs"].items():
            for name in row["figures"]:
                rows.append(
                    (
                        f"consumer ingest, {keyed_by}-keyed",
                        name,
                        f"{row['records_per_s'][name]:.0f} records/s, {row['spans_per_s'][name]:.0f} spans/s",
                        f"{row['vs_bare'][name]:.2f}x bare",
                    )
                )
    client = results.get("kafka_client")
    if client and "inputs" in client:
        for keyed_by, row in client["inputs"].items():
            for name in row["figures"]:
                rows.append(
                    (
                        f"Kafka client, {'Collector firehose' if keyed_by == 'firehose' else keyed_by + '-keyed'}",
                        name,
                        f"{row['records_per_s'][name]:.0f} records/s",
                        f"{row['vs_bare'][name]:.2f}x bare",
                    )
                )
    restore = results.get("state_restore")
    if restore:
        rows.append(
            (
                "state restore",
                f"{restore['conversations']:,} conversations",
                f"{restore['median_s']:.2f} s ({restore['records_per_s']:.0f} records/s)",
                f"{restore['seconds_per_100k']:.1f} s per 100k",
            )
        )
    memory = results.get("memory")
    if memory:
        for row in memory.values():
            rows.append(
                (
                    "memory",
                    f"{row['open_conversations']} open x {row['turns_each']} turns",
                    f"{row['bytes_per_conversation'] / 1024:.2f} KiB/conversation",
                    f"{row['rss_bytes'] / 2**20:.0f} MiB RSS",
                )
            )
    tokens = results.get("judge_tokens")
    if tokens:
        for name in ("tracejudge", "eval-ai-library 0.8.2"):
            if name in tokens:
                row = tokens[name]
                rows.append(
                    (
                        "judge tokens",
                        name,
                        f"{row['input_tokens_per_conversation']:.0f} input tokens/conversation",
                        f"{row['cacheable_share']:.0%} static prefix ({row['static_prefix_tokens_per_call']:.0f}/call)",
                    )
                )
    scale = results.get("scale_out")
    if scale:
        from bench.scale_out import table_rows as scale_rows

        rows.extend(scale_rows(scale))
    peer = results.get("peer_quix")
    if peer and "best" in peer:
        from bench.peer_quix import OURS, OURS_RDK

        ratios = {OURS: peer.get("ours_vs_quix_cpu"), OURS_RDK: peer.get("ours_librdkafka_vs_quix_cpu")}
        for name, figure in peer["best"].items():
            ratio = ratios.get(name)
            rows.append(
                (
                    f"stream-processing peer, conversation-keyed, {peer['records']} records",
                    name,
                    f"{figure['records_per_s']:.0f} records/s, {figure['cpu_s_per_1000_records']:.3f} CPU s/1k records",
                    "" if ratio is None else f"{ratio:.2f}x Quix's CPU efficiency",
                )
            )
    for name, profile in (peer or {}).get("profile", {}).items():
        top = ", ".join(f"{area} {share:.0%}" for area, share in list(profile["areas"].items())[:4])
        rows.append(("profile, Python time holding the GIL (py-spy)", name, top, ""))
    compiled = results.get("compiled_path")
    if compiled and "consume" in compiled:
        from bench.compiled_path import table_rows as compiled_rows

        rows.extend(compiled_rows(compiled))
    cost = results.get("judge_cost")
    if cost:
        from bench.judge_cost import table_rows

        rows.extend(table_rows(cost))
    width = [max(len(str(r[i])) for r in rows) for i in range(4)] if rows else [0] * 4
    lines = [" | ".join(str(c).ljust(width[i]) for i, c in enumerate(r)) for r in rows]
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m bench")
    benches = ["tracer", "judge", "ingest", "client", "restore", "memory", "tokens", "cost", "scale", "quix", "mypyc"]
    parser.add_argument(
        "--only",
        type=lambda value: [name.strip() for name in value.split(",")],
        action="extend",
        help=f"comma-separated, of {', '.join(benches)}: run these only; others keep their results",
    )
    parser.add_argument("--quick", action="store_true", help="smaller sizes, three rounds: a smoke run")
    parser.add_argument(
        "--max-replicas",
        "--replicas",
        type=int,
        default=None,
        help="scale: replicas from 1 up to this many (default: the machine's cores)",
    )
    args = parser.parse_args()
    logging.basicConfig(level=logging.CRITICAL)
    for noisy in ("langfuse", "opentelemetry", "kafka", "LiteLLM"):
        logging.getLogger(noisy).setLevel(logging.CRITICAL)
    only = set(args.only or benches)
    if only - set(benches):
        parser.error(f"unknown bench: {', '.join(sorted(only - set(benches)))} (choose from {', '.join(benches)})")
    rounds = 3 if args.quick else 5
    earlier: dict[str, Any] = json.loads(RESULTS.read_text()) if RESULTS.exists() else {}
    results: dict[str, Any] = dict(earlier) if args.only else {}
    results.update({"machine": machine(), "date": datetime.now(UTC).isoformat(timespec="seconds")})
    if "tracer" in only:
        from bench import tracer_overhead

        results["tracer_overhead"] = tracer_overhead.run(calls=5_000 if args.quick else 20_000, rounds=max(rounds, 7))
    if "judge" in only:
        from bench import judge_throughput

        results["judge_throughput"] = judge_throughput.run(count=100, rounds=rounds, with_peer=not args.quick)
    if "ingest" in only:
        from bench import consumer_ingest

        results["consumer_ingest"] = consumer_ingest.run(conversations=5_000 if args.quick else 20_000, rounds=rounds)
    if "client" in only:
        from bench import kafka_client

        client = kafka_client.run(conversations=5_000 if args.quick else 20_000, rounds=rounds)
        if "skipped" in client:  # confluent-kafka is not installed: the figures of an earlier run stay
            print(f"client: {client['skipped']}")
            results["kafka_client"] = earlier.get("kafka_client", client)
        else:  # its own machine and date: a section run alone may run on another host than the rest
            results["kafka_client"] = {"machine": machine(), "date": results["date"], **client}
    if "restore" in only:
        from bench import state_restore

        size = 20_000 if args.quick else 100_000
        results["state_restore"] = state_restore.run(conversations=size, rounds=2 if args.quick else 3)
    if "memory" in only:
        from bench import memory

        results["memory"] = memory.run()
    if "tokens" in only:
        from bench import judge_tokens

        results["judge_tokens"] = judge_tokens.run()
    if "cost" in only:
        from bench import judge_cost

        results["judge_cost"] = judge_cost.run()
    if "scale" in only:
        from bench import scale_out

        scale = scale_out.run(
            conversations=1_000 if args.quick else scale_out.CONVERSATIONS,
            max_replicas=args.max_replicas,
            rounds=1 if args.quick else scale_out.ROUNDS,
        )
        results["scale_out"] = {"date": results["date"], **scale}
    if "quix" in only:
        from bench import peer_quix

        peer = peer_quix.run(conversations=1_000 if args.quick else 16_000, rounds=1 if args.quick else 2)
        if "skipped" in peer:  # the figures of an earlier run stay
            print(f"quix: {peer['skipped']}")
            results["peer_quix"] = earlier.get("peer_quix", peer)
        else:
            if shutil.which("py-spy") or Path(sys.executable).with_name("py-spy").exists():
                # where each spends: one more round of each under py-spy, its own records (shares, not rates)
                peer["profile"] = peer_quix.profiled(conversations=4_000 if args.quick else 12_000)
            results["peer_quix"] = {"machine": machine(), "date": results["date"], **peer}
    if "mypyc" in only:
        from bench import compiled_path

        try:
            compiled = compiled_path.run(conversations=1_000 if args.quick else 6_000, rounds=rounds)
        except RuntimeError as exc:  # a measured process failed: the other benches' figures are still written
            compiled = {"skipped": f"mypyc: {exc}"}
        if "skipped" in compiled:  # no C compiler or mypy here, or a failed run: the figures of an earlier run stay
            print(compiled["skipped"])
            results["compiled_path"] = earlier.get("compiled_path", compiled)
        else:
            results["compiled_path"] = {"machine": machine(), "date": results["date"], **compiled}
    RESULTS.write_text(json.dumps(results, indent=2) + "\n")
    about = results["machine"]
    print(f"machine: {about['cpu']} ({about['cores']} cores), Python {about['python']}")
    print(table(results))
    print(f"\nwritten: {RESULTS}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
