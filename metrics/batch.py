"""The batch tier: judge calls gathered and sent through the provider's Batch API (LiteLLM's files and batches).

A judge call at the batch tier is the same request body the standard tier sends (model, messages, temperature 0,
the verdict's JSON schema), one line of a JSONL file; its `custom_id` is a hash of that body, so the same judgement
asked again (a replay after a restart) names the same line. A batch is durable state: it is written to a
`BatchStore` (the consumer's compacted topic) before it is submitted, with a local key that also goes into the
provider batch's `metadata`, then again with the provider's batch id. After a restart every recorded batch is polled
again, and a call whose `custom_id` is in one waits for that batch instead of paying for a second.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from tracejudge._shared.rate_limited_log import RateLimitedLog

from ._backends import JudgeBackend, LiteLLMBackend
from ._client import JudgeReply
from ._errors import JudgeCallError
from ._litellm import (
    _LITELLM_IMPORTED,
    _import_litellm,
    litellm_model_string,
    needs_cache_breakpoint,
    with_cache_breakpoint,
)
from ._provider_errors import classify_litellm_error
from ._results import ERROR_BAD_REQUEST, ERROR_INTERNAL, ERROR_SERVER
from ._usage import usage_tokens
from .tiers import BATCH_PROVIDERS, TIER_BATCH, tier_cost

__all__ = [
    "BatchBackend",
    "BatchCoordinator",
    "BatchStore",
    "LiteLLMBackend",
    "MemoryBatchStore",
    "batch_problem",
    "litellm_model_string",
]

logger = logging.getLogger("tracejudge.metrics.batch")

ERROR_BATCH_EXPIRED = "batch_expired"  # expired or cancelled twice (resubmitted once)
ERROR_BATCH_FAILED = "batch_failed"  # the provider refused the whole batch (validation)
COMPLETION_WINDOW = "24h"
ENDPOINT = "/v1/chat/completions"
METADATA_KEY = "tracejudge_batch"
# How long a submitted batch is remembered (and polled again after a restart): past the provider's 24 h window.
RECORD_RETENTION_S = 3 * 86_400.0
# An answered batch matters after a restart only for judgements delivered but not yet committed (seconds): it is
# remembered this long after it was answered (not after it was created: a batch can take hours), then tombstoned.
DONE_RETENTION_S = 3_600.0
SWEEP_INTERVAL_S = 60.0
# A replica following another's batch (after a rebalance) waits this long for its creator's retry of it.
RETRY_GRACE_S = 2.0
# A batch another replica recorded without its provider id yet is looked up by its metadata only after this long.
LOOKUP_AFTER_S = 120.0
_TERMINAL_OK = "completed"
_RESUBMIT = ("expired", "cancelled")
_MAX_KEPT_RESULTS = 200_000


class BatchStore(Protocol):
    """Durable batch records (the latest per `key`); `save` returns once the record is durable."""

    def save(self, record: dict[str, Any]) -> None: ...

    def load(self) -> list[dict[str, Any]]: ...

    def forget(self, key: str) -> None:
        """The batch no longer matters (answered long ago, abandoned, past the provider's window): a tombstone."""
        ...


class MemoryBatchStore:
    """Not durable: for the library used without a consumer (a notebook), and tests of the coordinator alone."""

    def __init__(self) -> None:
        self.records: dict[str, dict[str, Any]] = {}

    def save(self, record: dict[str, Any]) -> None:
        self.records[record["key"]] = dict(record)

    def load(self) -> list[dict[str, Any]]:
        return list(self.records.values())

    def forget(self, key: str) -> None:
        self.records.pop(key, None)


def batch_provider(litellm_model: str) -> str:
    return litellm_model.partition("/")[0]


def batch_problem(litellm_model: str) -> str | None:
    """Why this model cannot be judged at the batch tier (None: it can)."""
    provider = batch_provider(litellm_model)
    if provider in BATCH_PROVIDERS:
        return None
    return (
        f"--judge-tier batch: provider {provider!r} (judge model {litellm_model!r}) has no Batch API reachable "
        f"through LiteLLM's OpenAI-format files and batches here (supported: {', '.join(sorted(BATCH_PROVIDERS))}); "
        "use --judge-tier flex or standard"
    )


def custom_id(body: dict[str, Any]) -> str:
    """The request's id in the batch: a hash of the whole body, so a replayed judgement names the same line."""
    material = json.dumps(body, sort_keys=True, ensure_ascii=False, separators=(",", ":"))
    return "tj-" + hashlib.sha256(material.encode("utf-8", "surrogatepass")).hexdigest()[:40]


@dataclass
class _Batch:
    key: str
    custom_ids: list[str]
    bodies: dict[str, dict[str, Any]] = field(default_factory=dict)  # empty for a batch resumed after a restart
    batch_id: str | None = None
    attempt: int = 1
    created: float = field(default_factory=time.time)
    state: str = "submitting"
    done_at: float | None = None  # when its answers were handed out (state done or resubmitted)
    owner: str | None = None  # the coordinator that created it: the one that resubmits it (others wait for that)
    learnt: bool = False  # written by another replica while this one runs (it may still be creating it)

    def record(self, model: str) -> dict[str, Any]:
        return {
            "key": self.key,
            "model": model,
            "state": self.state,
            "batch_id": self.batch_id,
            "attempt": self.attempt,
            "created": self.created,
            "done_at": self.done_at,
            "owner": self.owner,
            "custom_ids": self.custom_ids,
        }


class BatchCoordinator:
    """One per process and model: gathers requests, submits batches, polls them, hands each answer to its caller.

    Runs on the event loop of the first call (the judge pool's). Thread-safe `attach_store`/`learn` for the
    consumer, which hands over the durable store once Kafka is reached and every record written by other replicas.
    """

    def __init__(
        self,
        litellm_model: str,
        *,
        batch_size: int = 500,
        batch_wait_s: float = 60.0,
        poll_s: float = 30.0,
        store: BatchStore | None = None,
        on_event: Callable[[str], None] | None = None,
    ) -> None:
        self.litellm_model = litellm_model
        self.provider = batch_provider(litellm_model)
        self.batch_size = batch_size
        self.batch_wait_s = batch_wait_s
        self.poll_s = poll_s
        self.on_event = on_event  # "submitted", "resumed", "resubmitted", "expired", "failed_items"
        self._store = store
        self._store_ready = threading.Event()
        if store is not None:
            self._store_ready.set()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._lock: asyncio.Lock | None = None
        self._resumed = False
        self._pending: OrderedDict[str, dict[str, Any]] = OrderedDict()
        self._waiting: dict[str, list[asyncio.Future[JudgeReply]]] = {}
        self._results: OrderedDict[str, JudgeReply | JudgeCallError] = OrderedDict()
        self._known: dict[str, str] = {}  # custom_id → key of the batch it is in
        self._answered: dict[str, dict[str, Any]] = {}  # custom_id → record of a recent batch already answered
        self._retired: dict[str, tuple[float, list[str]]] = {}  # key of an answered batch → (answered at, its ids)
        self._swept = 0.0
        self._batches: dict[str, _Batch] = {}
        self._timer: asyncio.TimerHandle | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._log = RateLimitedLog(logger, interval_s=60.0)
        self.submissions = 0  # batches created at the provider by this process (resubmissions included)
        self.id = uuid.uuid4().hex  # this coordinator, in the records of the batches it creates

    # -- for the consumer -------------------------------------------------------------------------------------------

    def attach_store(self, store: BatchStore) -> None:
        self._store = store
        self._store_ready.set()

    def learn(self, record: dict[str, Any]) -> None:
        """A batch record another replica wrote (any thread): its requests are not submitted again here."""
        loop = self._loop
        if loop is not None and not loop.is_closed():
            loop.call_soon_threadsafe(self._adopt, record, True)

    # -- the calls --------------------------------------------------------------------------------------------------

    async def request(self, body: dict[str, Any]) -> JudgeReply:
        await self._ready()
        cid = custom_id(body)
        done = self._results.pop(cid, None)
        if done is not None:
            return _settled(done)
        answered = self._answered.pop(cid, None)
        if answered is not None:  # asked again after its batch was answered (a replay): its output is read again
            self._adopt(answered, now=True)
        assert self._loop is not None
        future: asyncio.Future[JudgeReply] = self._loop.create_future()
        self._waiting.setdefault(cid, []).append(future)
        known = self._known.get(cid)
        if known is not None and known in self._batches:  # a resumed batch has no bodies: kept for a resubmission
            self._batches[known].bodies.setdefault(cid, body)
        if known is None and cid not in self._pending:
            self._pending[cid] = body
            if len(self._pending) >= self.batch_size:
                self._flush()
            elif self._timer is None:
                self._timer = self._loop.call_later(self.batch_wait_s, self._flush)
        try:
            return await asyncio.shield(future)
        except asyncio.CancelledError:
            waiting = self._waiting.get(cid)
            if waiting and future in waiting:
                waiting.remove(future)
            raise

    async def _ready(self) -> None:
        if self._loop is None:
            self._loop = asyncio.get_running_loop()
            self._lock = asyncio.Lock()
        if self._resumed:
            return
        assert self._lock is not None
        async with self._lock:
            if self._resumed:
                return
            while not await asyncio.to_thread(self._store_ready.wait, 0.5):  # attached once Kafka is reached
                pass
            assert self._store is not None
            records = await asyncio.to_thread(self._store.load)
            for record in records:
                self._adopt(record)
            self._resumed = True

    def _adopt(self, record: dict[str, Any], learnt: bool = False, *, now: bool = False) -> None:
        """A recorded batch: poll it (again) unless this process already does, or it is too old to matter. A batch
        already answered is only indexed: its output is read again if one of its requests is asked for (a replay)."""
        key = str(record.get("key"))
        if record.get("model") != self.litellm_model:
            return
        if record.get("state") == "abandoned":
            self._tombstone(key)
            return
        known = self._batches.get(key)
        if known is not None:  # a later record of a batch followed here: the provider's id, once written
            if known.batch_id is None and record.get("batch_id"):
                known.batch_id = str(record["batch_id"])
            return
        age = time.time() - float(record.get("created") or 0)
        if age > RECORD_RETENTION_S:
            self._tombstone(key)
            return
        if record.get("state") in ("done", "resubmitted") and not now:
            done_at = float(record.get("done_at") or record.get("created") or 0)
            if time.time() - done_at <= DONE_RETENTION_S:
                self._index_answered(key, done_at, record)
            else:
                self._tombstone(key)
            return
        for cid in record.get("custom_ids") or []:
            self._answered.pop(cid, None)
        batch = _Batch(
            key=key,
            custom_ids=list(record.get("custom_ids") or []),
            batch_id=record.get("batch_id"),
            attempt=int(record.get("attempt") or 1),
            created=float(record.get("created") or time.time()),
            state=str(record.get("state")),
            learnt=learnt,
            owner=record.get("owner"),
        )
        self._batches[key] = batch
        for cid in batch.custom_ids:
            self._known[cid] = key
            self._pending.pop(cid, None)
        self._event("resumed")
        logger.info(
            "judge batch %s (%s, %d requests) resumed: polled again, its judgements are not paid for twice",
            batch.batch_id or key,
            batch.state,
            len(batch.custom_ids),
        )
        self._spawn(self._guarded(batch, self._follow(batch)))

    def _index_answered(self, key: str, done_at: float, record: dict[str, Any]) -> None:
        cids = [str(cid) for cid in record.get("custom_ids") or []]
        for cid in cids:
            self._answered[cid] = record
        self._retired[key] = (done_at, cids)

    def _retire(self, batch: _Batch) -> None:
        """Answered: no longer followed nor held with its bodies; indexed (for a replay) until DONE_RETENTION_S."""
        self._batches.pop(batch.key, None)
        batch.bodies = {}
        record = batch.record(self.litellm_model)
        record["custom_ids"] = [cid for cid in batch.custom_ids if self._known.get(cid) in (None, batch.key)]
        self._index_answered(batch.key, batch.done_at or time.time(), record)
        self._sweep()

    def _sweep(self) -> None:
        """Answered batches past DONE_RETENTION_S: forgotten here and tombstoned in the store (at most once a
        minute), so neither the index nor the compacted topic grows with every batch ever made."""
        now = time.time()
        if now - self._swept < SWEEP_INTERVAL_S:
            return
        self._swept = now
        for key, (done_at, cids) in list(self._retired.items()):
            if now - done_at <= DONE_RETENTION_S:
                continue
            del self._retired[key]
            for cid in cids:
                if self._answered.get(cid, {}).get("key") == key:
                    del self._answered[cid]
            self._tombstone(key)

    def _tombstone(self, key: str) -> None:
        store = self._store
        forget = getattr(store, "forget", None)
        if forget is None or self._loop is None:
            return

        async def write() -> None:
            try:
                await asyncio.to_thread(forget, key)
            except Exception as exc:
                self._log.warning("tombstoning judge batch %s failed: %r (done again at the next start)", key, exc)

        self._spawn(write())

    def _spawn(self, coroutine: Any) -> None:
        assert self._loop is not None
        task = self._loop.create_task(coroutine)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _event(self, name: str) -> None:
        if self.on_event is not None:
            try:
                self.on_event(name)
            except Exception:
                logger.exception("counting a batch event failed")

    def _flush(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        while self._pending:
            items: list[tuple[str, dict[str, Any]]] = []
            while self._pending and len(items) < self.batch_size:
                items.append(self._pending.popitem(last=False))
            batch = _Batch(
                key=uuid.uuid4().hex, custom_ids=[cid for cid, _ in items], bodies=dict(items), owner=self.id
            )
            self._batches[batch.key] = batch
            for cid in batch.custom_ids:
                self._known[cid] = batch.key
            self._spawn(self._guarded(batch, self._submit_and_follow(batch)))

    # -- one batch's life -------------------------------------------------------------------------------------------

    async def _save(self, batch: _Batch) -> None:
        assert self._store is not None
        await asyncio.to_thread(self._store.save, batch.record(self.litellm_model))

    async def _guarded(self, batch: _Batch, work: Any) -> None:
        """A bug here must not leave calls waiting for ever: they fail (internal) and the batch stays recorded."""
        try:
            await work
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            logger.exception("judge batch %s: internal error", batch.batch_id or batch.key)
            self._finish(
                batch, {}, JudgeCallError(ERROR_INTERNAL, f"batch tier internal error: {exc!r}", retryable=False)
            )

    async def _submit_and_follow(self, batch: _Batch) -> None:
        try:
            await self._submit(batch)
        except Exception as exc:
            error = exc if isinstance(exc, JudgeCallError) else classify_litellm_error(exc)
            self._log.warning(
                "judge batch of %d requests could not be submitted: %s (the judgements fail; check the judge "
                "endpoint and key)",
                len(batch.custom_ids),
                error,
            )
            batch.state = "abandoned"
            try:
                await self._save(batch)
            except Exception:
                logger.exception("recording an abandoned judge batch failed")
            self._finish(batch, {}, JudgeCallError(error.kind, f"batch not submitted: {error}", retryable=False))
            self._batches.pop(batch.key, None)
            return
        await self._follow(batch)

    async def _submit(self, batch: _Batch) -> None:
        """Recorded first (no batch id yet, the key in its metadata), then uploaded and created, then recorded
        with the provider's id: a crash in between finds the batch again by its metadata."""
        litellm = _import_litellm()
        batch.state = "submitting"
        batch.batch_id = None
        await self._save(batch)
        lines = [
            json.dumps(
                {"custom_id": cid, "method": "POST", "url": ENDPOINT, "body": batch.bodies[cid]},
                ensure_ascii=False,
                separators=(",", ":"),
            )
            for cid in batch.custom_ids
        ]
        content = ("\n".join(lines) + "\n").encode("utf-8", "surrogatepass")
        uploaded = await litellm.acreate_file(
            file=(f"tracejudge-{batch.key}.jsonl", content, "application/jsonl"),
            purpose="batch",
            custom_llm_provider=self.provider,
        )
        created = await litellm.acreate_batch(
            completion_window=COMPLETION_WINDOW,
            endpoint=ENDPOINT,
            input_file_id=uploaded.id,
            custom_llm_provider=self.provider,
            metadata={METADATA_KEY: batch.key},
        )
        batch.batch_id = created.id
        batch.state = "submitted"
        self.submissions += 1
        await self._save(batch)
        self._event("resubmitted" if batch.attempt > 1 else "submitted")
        logger.info("judge batch %s submitted: %d requests", batch.batch_id, len(batch.custom_ids))

    async def _find_by_metadata(self, batch: _Batch) -> str | None:
        litellm = _import_litellm()
        listed = await litellm.alist_batches(custom_llm_provider=self.provider, limit=100)
        for item in getattr(listed, "data", None) or []:
            metadata = getattr(item, "metadata", None) or {}
            if metadata.get(METADATA_KEY) == batch.key:
                return str(item.id)
        return None

    async def _follow(self, batch: _Batch) -> None:
        """Poll until the batch ends; hand out its answers; resubmit an expired or cancelled one once."""
        litellm = _import_litellm()
        while True:
            try:
                if batch.batch_id is None and batch.learnt and time.time() - batch.created < LOOKUP_AFTER_S:
                    await asyncio.sleep(self.poll_s)  # another replica is creating it: its id is on its way
                    continue
                if batch.batch_id is None:  # recorded, and the process died before the provider's id was
                    found = await self._find_by_metadata(batch)
                    if found is None:  # never created: its requests are submitted again when asked for
                        batch.state = "abandoned"
                        await self._save(batch)
                        self._forget(batch)
                        return
                    batch.batch_id, batch.state = found, "submitted"
                    await self._save(batch)
                status = await litellm.aretrieve_batch(batch.batch_id, custom_llm_provider=self.provider)
            except Exception as exc:
                self._log.warning(
                    "polling judge batch %s failed: %s (polled again in %gs)",
                    batch.batch_id,
                    classify_litellm_error(exc),
                    self.poll_s,
                )
                await asyncio.sleep(self.poll_s)
                continue
            state = str(getattr(status, "status", ""))
            if state in (_TERMINAL_OK, "failed", *_RESUBMIT):
                try:
                    answers = await self._answers(status)
                except Exception as exc:
                    self._log.warning("reading judge batch %s failed: %s (read again)", batch.batch_id, exc)
                    await asyncio.sleep(self.poll_s)
                    continue
                if batch.state == "resubmitted":  # resumed: its unanswered requests are in a later batch
                    self._finish(batch, answers, None)
                    batch.done_at = batch.done_at or time.time()
                    self._retire(batch)
                    return
                if state == _TERMINAL_OK or state == "failed":
                    reason = _batch_errors(status) if state == "failed" else "missing from the batch's output"
                    kind = ERROR_BATCH_FAILED if state == "failed" else ERROR_SERVER
                    self._finish(
                        batch, answers, JudgeCallError(kind, f"judge batch {state}: {reason}", retryable=False)
                    )
                    await self._done(batch, "done")
                    return
                left = [cid for cid in batch.custom_ids if cid not in answers and cid in batch.bodies]
                if batch.attempt == 1:
                    self._finish(batch, answers, None)
                    for cid in batch.custom_ids:  # nobody waits for these now: a later call submits them anew
                        if cid not in answers and cid not in batch.bodies and self._known.get(cid) == batch.key:
                            del self._known[cid]
                    bodies = {cid: batch.bodies[cid] for cid in left}
                    # One retry per batch, whoever follows it (a rebalance leaves two replicas polling the same
                    # batch): its key derives from the batch's, and a retry another replica recorded is followed.
                    retry_key = f"{batch.key}.retry"
                    theirs = await self._their_retry(batch, retry_key)
                    if theirs is not None:
                        mine = [cid for cid in left if cid not in theirs.custom_ids]
                        for cid in left:
                            if cid in theirs.custom_ids:
                                theirs.bodies.setdefault(cid, bodies[cid])
                                self._known[cid] = retry_key
                        left, bodies = mine, {cid: bodies[cid] for cid in mine}
                        retry_key = f"{batch.key}.retry.{uuid.uuid4().hex[:8]}"  # what their retry does not hold
                    retry = _Batch(key=retry_key, custom_ids=left, bodies=bodies, attempt=2, owner=self.id)
                    for cid in left:  # before this batch retires, so a call asking meanwhile waits for the retry
                        self._known[cid] = retry.key
                    if left:
                        self._batches[retry.key] = retry
                    await self._done(batch, "resubmitted")
                    if not left:
                        return
                    logger.warning(
                        "judge batch %s %s with %d requests unanswered: submitted again once",
                        batch.batch_id,
                        state,
                        len(left),
                    )
                    self._spawn(self._guarded(retry, self._submit_and_follow(retry)))
                    return
                self._event("expired")
                self._log.warning(
                    "judge batch %s %s again (%d requests unanswered): they fail (batch_expired); raise the "
                    "provider's batch capacity or use --judge-tier flex",
                    batch.batch_id,
                    state,
                    len(left),
                )
                self._finish(
                    batch,
                    answers,
                    JudgeCallError(ERROR_BATCH_EXPIRED, f"judge batch {state} after one resubmission", retryable=False),
                )
                await self._done(batch, "done")
                return
            await asyncio.sleep(self.poll_s)

    async def _their_retry(self, batch: _Batch, retry_key: str) -> _Batch | None:
        """The retry another replica made of `batch`, now followed here, or None. A batch this coordinator did not
        create is resubmitted by its creator: its retry record is waited for (`RETRY_GRACE_S`, or a few polls)
        before this one resubmits (its creator may be gone: a kill -9, a restart)."""
        deadline = time.monotonic() + (0.0 if batch.owner in (None, self.id) else max(RETRY_GRACE_S, 3 * self.poll_s))
        while True:
            theirs = self._batches.get(retry_key)
            if theirs is None:
                recorded = await self._recorded(retry_key)
                if recorded is not None:
                    self._adopt(recorded, True, now=True)  # answered already: its output is read again
                    theirs = self._batches.get(retry_key)
            if theirs is not None or time.monotonic() >= deadline:
                return theirs
            await asyncio.sleep(min(self.poll_s, 0.5))

    async def _recorded(self, key: str) -> dict[str, Any] | None:
        """The store's latest record of a batch (another replica's), or None."""
        if self._store is None:
            return None
        records = await asyncio.to_thread(self._store.load)
        return next((r for r in records if r.get("key") == key and r.get("state") != "abandoned"), None)

    async def _done(self, batch: _Batch, state: str) -> None:
        batch.state, batch.done_at = state, time.time()
        await self._save_quietly(batch)
        self._retire(batch)

    async def _save_quietly(self, batch: _Batch) -> None:
        try:
            await self._save(batch)
        except Exception as exc:
            self._log.warning("recording judge batch %s failed: %r", batch.batch_id, exc)

    async def _answers(self, status: Any) -> dict[str, JudgeReply | JudgeCallError]:
        """Every answered line of the output file (a reply) and of the error file (a failure with its reason)."""
        litellm = _import_litellm()
        answers: dict[str, JudgeReply | JudgeCallError] = {}
        failed = 0
        for attribute in ("output_file_id", "error_file_id"):
            file_id = getattr(status, attribute, None)
            if not file_id:
                continue
            content = await litellm.afile_content(file_id=file_id, custom_llm_provider=self.provider)
            raw = content.content if hasattr(content, "content") else bytes(content)
            for line in raw.decode("utf-8", "surrogatepass").splitlines():
                if not line.strip():
                    continue
                item = json.loads(line)
                if _unreached(item):  # an expired or cancelled batch's lines it never ran: submitted again once
                    continue
                answer = self._answer(item)
                answers[str(item.get("custom_id"))] = answer
                failed += isinstance(answer, JudgeCallError)
        if failed:
            self._event("failed_items")
        return answers

    def _answer(self, item: dict[str, Any]) -> JudgeReply | JudgeCallError:
        response = item.get("response") or {}
        error = item.get("error")
        status = int(response.get("status_code") or 0)
        body = response.get("body") or {}
        if error or status >= 400 or not body:
            detail = error or (body.get("error") if isinstance(body, dict) else None) or body
            message = detail.get("message") if isinstance(detail, dict) else str(detail)
            kind = ERROR_SERVER if status >= 500 else ERROR_BAD_REQUEST
            return JudgeCallError(
                kind, f"batch item failed ({status or 'no status'}): {str(message)[:300]}", retryable=False
            )
        try:
            text = body["choices"][0]["message"]["content"] or ""
        except (KeyError, IndexError, TypeError):
            return JudgeCallError(ERROR_SERVER, "batch item without a message", retryable=False)
        prompt, read, written, output = usage_tokens(body.get("usage"))
        cost = tier_cost(
            self.litellm_model,
            TIER_BATCH,
            input_tokens=prompt,
            output_tokens=output,
            cached_input_tokens=read,
            cache_write_input_tokens=written,
        )
        return JudgeReply(
            text=text,
            cost_usd=cost,
            input_tokens=prompt,
            output_tokens=output,
            cached_input_tokens=read,
            cache_write_input_tokens=written,
            tier=TIER_BATCH,
        )

    def _finish(
        self, batch: _Batch, answers: dict[str, JudgeReply | JudgeCallError], missing: JudgeCallError | None
    ) -> None:
        """Hand each answer to whoever waits for it (or keep it for the replayed call that will ask)."""
        for cid in batch.custom_ids:
            answer = answers.get(cid, missing)
            owner = self._known.get(cid)
            if answer is None or (owner is not None and owner != batch.key):  # None, or asked again in a later batch
                continue
            if owner is not None:
                del self._known[cid]
            waiting = self._waiting.pop(cid, [])
            live = [f for f in waiting if not f.done()]
            if live:
                for future in live:
                    if isinstance(answer, JudgeCallError):
                        future.set_exception(answer)
                    else:
                        future.set_result(answer)
            else:
                self._results[cid] = answer
                while len(self._results) > _MAX_KEPT_RESULTS:
                    self._results.popitem(last=False)

    def _forget(self, batch: _Batch) -> None:
        requeued = 0
        for cid in batch.custom_ids:
            if self._known.get(cid) == batch.key:
                del self._known[cid]
                body = batch.bodies.get(cid)
                if self._waiting.get(cid) and body is not None and cid not in self._pending:
                    self._pending[cid] = body  # asked for meanwhile: submitted now, not left waiting for days
                    requeued += 1
        self._batches.pop(batch.key, None)
        if requeued:
            self._log.warning(
                "judge batch %s was never created: its %d waiting requests are submitted again", batch.key, requeued
            )
            assert self._loop is not None
            if len(self._pending) >= self.batch_size:
                self._flush()
            elif self._timer is None:
                self._timer = self._loop.call_later(self.batch_wait_s, self._flush)


def _unreached(item: dict[str, Any]) -> bool:
    error = item.get("error")
    return isinstance(error, dict) and error.get("code") in ("batch_expired", "batch_cancelled")


def _settled(answer: JudgeReply | JudgeCallError) -> JudgeReply:
    if isinstance(answer, JudgeCallError):
        raise answer
    return answer


def _batch_errors(status: Any) -> str:
    errors = getattr(status, "errors", None)
    data = getattr(errors, "data", None) if errors is not None else None
    if isinstance(errors, dict):
        data = errors.get("data")
    messages = [
        str(getattr(e, "message", None) or (e.get("message") if isinstance(e, dict) else e)) for e in data or []
    ]
    return "; ".join(messages)[:300] or "no reason given"


class BatchBackend(JudgeBackend):
    """A judge call at the batch tier: the standard request body, answered through a `BatchCoordinator`."""

    tier = TIER_BATCH

    def __init__(self, model: str, coordinator: BatchCoordinator) -> None:
        self.model_name = model
        self.litellm_model = litellm_model_string(model)
        self.coordinator = coordinator
        self._breakpoint = needs_cache_breakpoint(self.litellm_model)
        self._with_breakpoint = with_cache_breakpoint
        self._temperature: bool | None = None

    async def warm_up(self) -> None:
        if not _LITELLM_IMPORTED.is_set():
            await asyncio.to_thread(_import_litellm)

    def _takes_temperature(self, model: str) -> bool:
        """What the standard tier sends, decided by LiteLLM (`drop_params`): gpt-5 reasoning models refuse
        temperature 0, and a batch line is sent as written, so the same parameter mapping is applied here."""
        if self._temperature is None:
            provider = self.litellm_model.partition("/")[0] if "/" in self.litellm_model else "openai"
            try:
                params = _import_litellm().get_optional_params(
                    model=model, custom_llm_provider=provider, temperature=0, drop_params=True
                )
                self._temperature = "temperature" in params
            except Exception:
                self._temperature = True
        return self._temperature

    async def complete(
        self, messages: list[dict[str, str]], *, timeout: float, response_format: dict[str, Any] | None = None
    ) -> JudgeReply:
        body: dict[str, Any] = {
            "model": self.litellm_model.partition("/")[2] or self.litellm_model,
            "messages": self._with_breakpoint(messages) if self._breakpoint else messages,
        }
        if self._takes_temperature(body["model"]):
            body["temperature"] = 0
        if response_format is not None:
            body["response_format"] = response_format
        return await self.coordinator.request(body)
