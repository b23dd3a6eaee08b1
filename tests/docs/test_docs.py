"""The README stays short and the docs/ pages stay true: links resolve, and the tables that moved out of the README
(flags, Prometheus series, benchmarks, costs) are checked against the code and bench/results.json."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from tests.consumer.test_cli_help import CONSUME_FLAGS
from tests.support.judge_server import JudgeServer

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
PAGES = [ROOT / "README.md", *sorted(DOCS.glob("*.md"))]
# Linked from here, written on another branch of the same issue; merged together with this one.


def table(text: str, header: str) -> list[list[str]]:
    """The rows (cells stripped) of the markdown table whose header line starts with `header`."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(header))
    rows = []
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            break
        rows.append([cell.strip() for cell in line.strip().strip("|").split(" | ")])
    return rows


def slug(heading: str) -> str:
    """GitHub's anchor for a heading."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower().replace("`", ""))
    return text.replace(" ", "-")


def test_readme_is_what_a_user_needs_first() -> None:
    text = (ROOT / "README.md").read_text()
    words = len(re.sub(r"```.*?```", "", text, flags=re.S).split())
    assert words < 1200, f"the README has {words} words outside code blocks"
    for command in ("make demo", "make test", "tracejudge broker", "tracejudge consume"):
        assert command in text
    assert "placeholder" in text and "Missing credentials" in text  # a local server needs a placeholder key
    for page in ("conventions", "guarantees", "benchmarks", "costs", "configuration", "deployment", "runbook"):
        assert f"(docs/{page}.md)" in text, page


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_every_relative_link_resolves(page: Path) -> None:
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if re.match(r"[a-z]+:", target):
            continue
        path, _, anchor = target.partition("#")
        resolved = (page.parent / path).resolve() if path else page
        assert resolved.exists(), f"{page.name}: {target} does not exist"
        if anchor:
            headings = re.findall(r"^#+ (.+)$", resolved.read_text(), re.M)
            assert anchor in {slug(h) for h in headings}, f"{page.name}: no heading #{anchor} in {path or page.name}"


def test_seed_phrases_are_explained_where_they_appear() -> None:
    for page in PAGES:
        text = " ".join(page.read_text().split())
        if "seeds' library" in text:
            assert "eval-ai-library" in text and "reference implementation" in text, page.name
        if "seed documents" in text or "seed snippets" in text:
            assert re.search(r"seed documents\*? \(the specification", text), page.name


def test_configuration_table_is_the_one_made_from_settings() -> None:
    """docs/configuration.md's option table is what Settings makes (`make options-table` rewrites it)."""
    from tracejudge.consumer.cli.options import TABLE_END, TABLE_START, markdown_table

    page = (DOCS / "configuration.md").read_text()
    committed = page.split(TABLE_START + "\n", 1)[1].split(TABLE_END, 1)[0]
    assert committed == markdown_table(), "docs/configuration.md's option table is stale: run `make options-table`"


def test_configuration_table_is_every_consume_flag_with_its_variable_and_default() -> None:
    from tracejudge.consumer.cli.options import TABLE_START

    block = (DOCS / "configuration.md").read_text().split(TABLE_START, 1)[1]
    rows = [row for section in block.split("\n### ")[1:] for row in table(section, "| flag |")]
    documented = {}
    for flag_cell, env_cell, default_cell, _what in rows:
        flag = re.match(r"`(--[\w-]+)", flag_cell)
        assert flag is not None, flag_cell
        documented[flag.group(1)] = (env_cell.strip("`"), default_cell.strip("`"))
    assert documented == CONSUME_FLAGS


def test_metrics_table_is_every_series_the_consumer_exports() -> None:
    from prometheus_client import CollectorRegistry

    from tracejudge.consumer.emit.prometheus import ConsumerInstruments
    from tracejudge.consumer.streams.instruments import StreamsInstruments
    from tracejudge.metrics.calibration import HallucinationCalibration

    text = (DOCS / "metrics.md").read_text()
    documented = set()
    for name_cell, *_ in table(text, "| name |"):
        names = re.findall(r"`(tracejudge_\w+|_\w+)`", name_cell)
        documented |= {names[0], *(names[0] + suffix for suffix in names[1:] if suffix.startswith("_"))}
    feedback = set(
        re.findall(r"`(tracejudge_(?:feedback|judge_human)\w*)\{", (DOCS / "feedback-and-backfill.md").read_text())
    )
    registry = CollectorRegistry()
    calibration = HallucinationCalibration(tp=18, fn=2, tn=95, fp=5)
    ConsumerInstruments(registry, calibration=calibration)
    StreamsInstruments(registry)
    exported = {metric.name.removesuffix("_total") for metric in registry.collect()}
    documented_names = {name.removesuffix("_total") for name in documented | feedback}
    assert exported == documented_names


def _per_100k(restore: dict) -> str:
    return f"{restore['same_disk_seconds_per_100k']:.1f} s per 100,000"


def expected_benchmark_rows(results: dict) -> list[list[str]]:
    rows = []
    tracer = results["tracer_overhead"]
    for name, f in tracer["figures"].items():
        ratio = tracer["ratio_to_hand_written"][name]
        median = f"{f['median']:.1f} µs (min {f['min']:.1f}, max {f['max']:.1f})"
        rows.append(["tracer, per turn", name, median, f"{ratio:.2f}x hand-written"])
    judge = results["judge_throughput"]
    title = f"judge, {judge['calls']} calls × {judge['latency_s'] * 1000:.0f} ms, concurrency {judge['concurrency']}"
    for name, f in judge["figures"].items():
        median = f"{f['median']:.2f} s (min {f['min']:.2f}, max {f['max']:.2f})"
        rows.append([title, name, median, f"{judge['limit_s'] / f['median']:.2f}x the {judge['limit_s']} s limit"])
    own = f"ours alone {judge['own_overhead_ms_per_call']:.3f} ms"
    rows.append(["judge CPU per call", "LiteLLM + tracejudge", f"{judge['cpu_ms_per_call_total']:.2f} ms", own])
    ingest = results["consumer_ingest"]
    for label, row in ingest["per_record_us"].items():
        for stage in ("protobuf parse", "read_events"):
            ratio = f"{row[stage] / row['protobuf parse']:.1f}x the parse"
            rows.append([f"one record, {label}, {row['bytes']} bytes", stage, f"{row[stage]:.1f} µs CPU", ratio])
    for keyed_by, row in ingest["inputs"].items():
        kind = "Collector firehose (9 in 10 records not GenAI)" if keyed_by == "firehose" else f"{keyed_by}-keyed"
        title = f"ingest, {kind}, {row['records']} records / {row['spans']} spans"
        for name in row["figures"]:
            rate = f"{row['records_per_s'][name]:.0f} records/s, {row['spans_per_s'][name]:.0f} spans/s"
            rows.append([title, name, rate, f"{row['vs_bare'][name]:.2f}x bare"])
    client = results.get("kafka_client", {})
    for keyed_by, row in client.get("inputs", {}).items():
        kind = "Collector firehose" if keyed_by == "firehose" else f"{keyed_by}-keyed"
        title = f"Kafka client, {kind}, {row['records']} records"
        for name in row["figures"]:
            rate = f"{row['records_per_s'][name]:.0f} records/s"
            rows.append([title, name, rate, f"{row['vs_bare'][name]:.2f}x bare"])
    restore = results["state_restore"]
    title = f"state restore, {restore['conversations']:,} conversations × {restore['turns_each']} turns"
    median = f"{restore['median_s']:.2f} s (min {restore['min_s']:.2f}, max {restore['max_s']:.2f})"
    per = f"{restore['seconds_per_100k']:.1f} s per 100,000, {restore['records_per_s']:.0f} records/s"
    rows.append([title, "fresh consumer: assigned → restored", median, per])
    if "same_disk_median_s" in restore:
        same = f"{restore['same_disk_median_s']:.2f} s"
        rows.append([title, "restarted on its disk: the local store from its checkpoint", same, _per_100k(restore)])
        json_median = f"{restore['json_median_s']:.2f} s"
        ratio = f"{restore['json_seconds_per_100k']:.1f} s per 100,000; MessagePack {restore['ratio_to_json']:.2f}x"
        rows.append([title, "fresh consumer, the changelog in JSON (before MessagePack)", json_median, ratio])
    for m in results["memory"].values():
        variant = f"{m['open_conversations']:,} open × {m['turns_each']} turns"
        per = f"{m['bytes_per_conversation'] / 1024:.2f} KiB per conversation"
        rows.append(["memory (RSS)", variant, per, f"{m['rss_bytes'] / 2**20:.0f} MiB"])
    for name, t in results["judge_tokens"].items():
        if not isinstance(t, dict):
            continue
        calls = t["input_tokens_per_conversation"] / t["input_tokens_per_call"]
        median = f"{t['input_tokens_per_conversation']:.0f} per conversation ({calls:.0f} calls)"
        prefix = f"{t['cacheable_share']:.0%} static prefix, {t['static_prefix_tokens_per_call']:.0f} tokens/call"
        rows.append(["judge input tokens (demo conversations)", name, median, prefix])
    return rows


SIZING_KEYINGS = {
    "conversation": "conversation id (our exporter)",
    "trace": "trace id (the Collector's Kafka exporter)",
    "firehose": "Collector firehose (9 in 10 records not GenAI)",
}


def expected_scale_rows(results: dict) -> list[list[str]]:
    """docs/benchmarks.md's scale-out table, from bench/results.json's `scale_out`."""
    rows = []
    for keyed_by, data in results["scale_out"]["inputs"].items():
        for r in data["runs"]:
            per = r["per_replica"]
            many = len(per) > 1
            rates = ", ".join(format(x["records_per_s"], ",.0f") for x in per)
            cpus = ", ".join(format(x["cpu_s_per_1000_records"], ".3f") for x in per)
            rate = f"{r['records_per_s']:,.0f}" + (f" ({rates})" if many else "")
            cpu = f"{r['cpu_s_per_1000_records']:.3f}" + (f" ({cpus})" if many else "")
            rows.append(
                [
                    f"{keyed_by}, {data['records']:,}",
                    r.get("producer_client", "kafka-python"),
                    f"{r['replicas']} ({'/'.join(str(p) for p in r['partitions_owned'])})",
                    rate,
                    f"{r['efficiency']:.2f}",
                    cpu,
                    f"{r['cpu_vs_one_replica']:.2f}x",
                    f"{r['broker_cpu_s_per_1000_records']:.3f}",
                ]
            )
    return rows


def _span(low: float, high: float, unit: str) -> str:
    a, b = f"{low:.1f}", f"{high:.1f}"
    return f"{a} {unit}" if a == b else f"{a}-{b} {unit}"


def expected_sizing_rows(results: dict) -> list[list[str]]:
    """docs/deployment.md's sizing table: for 10,000 spans/s (records per span as bench/consumer_ingest.py builds
    them), cores = records/s × CPU s per record over the scale-out runs of every number of replicas of each producer;
    replicas = the most cores / 0.7 (each replica one core, at most 70 % busy), rounded up."""
    rows = []
    for keyed_by, data in results["scale_out"]["inputs"].items():
        built = results["consumer_ingest"]["inputs"][keyed_by]
        rate = 10_000 * built["records"] / built["spans"]
        cores, replicas, broker = [], [], []
        for client in ("kafka-python", "librdkafka"):
            runs = [r for r in data["runs"] if r.get("producer_client", "kafka-python") == client]
            if not runs:
                cores.append("not measured")
                replicas.append("-")
                broker.append("-")
                continue
            cpu = [rate * r["cpu_s_per_1000_records"] / 1000 for r in runs]
            brokers = [rate * r["broker_cpu_s_per_1000_records"] / 1000 for r in runs]
            cores.append(_span(min(cpu), max(cpu), "cores"))
            replicas.append(str(-(-max(cpu) // 0.7)).removesuffix(".0"))
            broker.append(_span(min(brokers), max(brokers), "cores"))
        rows.append([SIZING_KEYINGS[keyed_by], f"{rate:,.0f}", *cores, " / ".join(replicas), " / ".join(broker)])
    return rows


def test_scale_out_and_sizing_tables_are_bench_results_json() -> None:
    """The scale-out table and the sizing table derived from it are the latest `python -m bench --only scale`."""
    results = json.loads((ROOT / "bench" / "results.json").read_text())
    assert table((DOCS / "benchmarks.md").read_text(), "| keying, records | producer |") == expected_scale_rows(results)
    assert table((DOCS / "deployment.md").read_text(), "| keying | records/s for 10,000 spans/s |") == (
        expected_sizing_rows(results)
    )


def test_benchmark_table_is_bench_results_json() -> None:
    results = json.loads((ROOT / "bench" / "results.json").read_text())
    text = (DOCS / "benchmarks.md").read_text()
    assert table(text, "| benchmark |") == expected_benchmark_rows(results)
    date = results["date"][:10]
    assert f"Python {results['machine']['python']}, {date}" in text
    assert f"- {results['machine']['cpu']}:" in text  # the host of the latest run is named
    client = results.get("kafka_client", {}).get("machine")
    assert client is None or f"- {client['cpu']}:" in text  # and the Kafka client rows' own host


def test_cost_table_is_bench_results_json() -> None:
    models = json.loads((ROOT / "bench" / "results.json").read_text())["judge_cost"]["models"]
    rows = table((DOCS / "costs.md").read_text(), "| judge model |")
    assert rows
    seen = set()
    for label, _minimum, steady, cold, theirs, ratio_steady, ratio_cold in rows:
        key = label.split(",")[0]
        suffix = ""
        if "earlier 1,024" in label:
            key = "gemini-2.5-flash (1,024 minimum)"
        elif "base rubric" in label:
            suffix = "_base_prompt"
        row = models[key]
        seen.add(key)
        assert steady == f"${row[f'tracejudge{suffix}_steady_usd'] * 1e3:.2f}", label
        assert cold == f"${row[f'tracejudge{suffix}_cold_usd'] * 1e3:.2f}", label
        assert theirs == f"${row['eval-ai-library 0.8.2 usd'] * 1e3:.2f}", label
        assert ratio_steady.strip("*") == f"{row[f'ratio_steady{suffix}']:.2f}x", label
        assert ratio_cold.strip("*") == f"{row[f'ratio_cold{suffix}']:.2f}x", label
    assert seen == set(models)


def test_a_local_server_without_a_key_is_refused_as_the_readme_says(
    judge_server: JudgeServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Why the README sets a placeholder OPENAI_API_KEY: without one LiteLLM never reaches the local server."""
    import asyncio

    from tracejudge.metrics import ConversationalEvalTestCase, EvalTestCase, FailureRateMetric

    conversation = ConversationalEvalTestCase(turns=[EvalTestCase(input="Hi", actual_output="Hello, how can I help?")])
    monkeypatch.delenv("OPENAI_API_KEY")
    refused = asyncio.run(FailureRateMetric(model="llama3.2", max_retries=0).evaluate(conversation))
    assert refused.score is None and "Missing credentials" in str(refused.error), refused
    assert judge_server.requests == []
    monkeypatch.setenv("OPENAI_API_KEY", "placeholder")
    judged = asyncio.run(FailureRateMetric(model="llama3.2", max_retries=0).evaluate(conversation))
    assert judged.verdict == "not_applicable" and len(judge_server.requests) == 1


def test_cost_by_tier_table_is_bench_results_json() -> None:
    """docs/costs.md's table by tier: per model the cheapest tier and its figures, as bench/judge_cost.py wrote them."""
    models = json.loads((ROOT / "bench" / "results.json").read_text())["judge_cost"]["models"]
    rows = table((DOCS / "costs.md").read_text(), "| judge model, cheapest tier |")
    assert {row[0] for row in rows} == set(models)
    for model, tier, steady, cold, ratio_steady, ratio_cold, every in rows:
        figures = models[model]["tiers"]
        assert tier == models[model]["cheapest_tier"], model
        best = figures[tier]
        assert steady == f"${best['steady_usd'] * 1e3:.2f}" and cold == f"${best['cold_usd'] * 1e3:.2f}", model
        assert ratio_steady == f"{best['ratio_steady']:.2f}x" and ratio_cold == f"{best['ratio_cold']:.2f}x", model
        assert every == ", ".join(f"{name} {f['ratio_steady']:.2f}x" for name, f in figures.items()), model
