"""The OpenAI Files and Batches API, served by the test judge server (tests/support/judge_server.py).

Upload a JSONL file (multipart, purpose=batch), create a batch over it (`metadata` kept, listed by GET /v1/batches),
then the batch moves validating → in_progress → completed (or failed, expired, cancelled as scripted) on a thread
of its own; each line is answered as the chat endpoint would answer it (the same script), into an output file, and
the lines answered with an error status into an error file. An expired batch leaves the lines it did not reach in
its error file with code `batch_expired`, as OpenAI does.
"""

from __future__ import annotations

import email.parser
import email.policy
import json
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

Answer = Callable[[dict[str, Any]], tuple[int, dict[str, Any]]]  # body → (status, response body)


@dataclass
class BatchScript:
    """What the next batches do: seconds in each state, a terminal status to force (`expired`, `failed`,
    `cancelled`) for the next ones, and a gate that holds batches in_progress until set."""

    validating_s: float = 0.05
    in_progress_s: float = 0.2
    outcomes: list[str] = field(default_factory=list)
    expire_after_items: int = 0  # an expired batch answers this many lines first
    hold: threading.Event = field(default_factory=lambda: _set_event())


def _set_event() -> threading.Event:
    event = threading.Event()
    event.set()
    return event


class BatchAPI:
    def __init__(self, answer: Answer) -> None:
        self.answer = answer
        self.script = BatchScript()
        self.files: dict[str, dict[str, Any]] = {}
        self.batches: dict[str, dict[str, Any]] = {}
        self.created: list[str] = []  # batch ids in creation order (a second submission shows here)
        self.uploads = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()

    def stop(self) -> None:
        self._stop.set()
        self.script.hold.set()

    # -- routing ----------------------------------------------------------------------------------------------------

    def handles(self, path: str) -> bool:
        path = path.split("?", 1)[0]
        return path.startswith("/v1/files") or path.startswith("/v1/batches")

    def route(self, method: str, path: str, headers: Any, body: bytes) -> tuple[int, bytes, str]:
        path = path.split("?", 1)[0].rstrip("/")
        parts = path.split("/")[2:]  # ["files", id, "content"] / ["batches", id, "cancel"]
        if method == "POST" and parts == ["files"]:
            return self._upload(headers, body)
        if method == "GET" and len(parts) == 3 and parts[0] == "files" and parts[2] == "content":
            record = self.files.get(parts[1])
            if record is None:
                return _error(404, "no such file")
            return 200, record["content"], "application/octet-stream"
        if method == "GET" and len(parts) == 2 and parts[0] == "files":
            record = self.files.get(parts[1])
            return (200, _json(record["object"]), "application/json") if record else _error(404, "no such file")
        if method == "POST" and parts == ["batches"]:
            return self._create(json.loads(body or b"{}"))
        if method == "GET" and parts == ["batches"]:
            with self._lock:
                data = [dict(b) for b in reversed(list(self.batches.values()))]
            return 200, _json({"object": "list", "data": data, "has_more": False}), "application/json"
        if method == "GET" and len(parts) == 2 and parts[0] == "batches":
            with self._lock:
                batch = self.batches.get(parts[1])
                snapshot = dict(batch) if batch else None
            return (200, _json(snapshot), "application/json") if snapshot else _error(404, "no such batch")
        if method == "POST" and len(parts) == 3 and parts[0] == "batches" and parts[2] == "cancel":
            with self._lock:
                batch = self.batches.get(parts[1])
                if batch is None:
                    return _error(404, "no such batch")
                if batch["status"] in ("validating", "in_progress"):
                    batch["status"] = "cancelling"
                snapshot = dict(batch)
            return 200, _json(snapshot), "application/json"
        return _error(404, f"no route {method} {path}")

    # -- files ------------------------------------------------------------------------------------------------------

    def _upload(self, headers: Any, body: bytes) -> tuple[int, bytes, str]:
        content_type = headers.get("content-type", "")
        message = email.parser.BytesParser(policy=email.policy.HTTP).parsebytes(
            f"content-type: {content_type}\r\n\r\n".encode() + body
        )
        purpose, content, filename = "", b"", "upload.jsonl"
        for part in message.iter_parts():
            name = part.get_param("name", header="content-disposition")
            if name == "purpose":
                purpose = part.get_content().strip() if part.get_content_maintype() == "text" else ""
                if not purpose:
                    purpose = bytes(part.get_payload(decode=True) or b"").decode().strip()
            elif name == "file":
                content = bytes(part.get_payload(decode=True) or b"")
                filename = part.get_filename() or filename
        if purpose != "batch" or not content:
            return _error(400, f"a batch file upload needs purpose=batch and content (got {purpose!r})")
        file_id = self._store_file(content, filename, purpose)
        with self._lock:
            self.uploads += 1
        return 200, _json(self.files[file_id]["object"]), "application/json"

    def _store_file(self, content: bytes, filename: str, purpose: str) -> str:
        file_id = f"file-{uuid.uuid4().hex[:24]}"
        record = {
            "id": file_id,
            "object": "file",
            "bytes": len(content),
            "created_at": int(time.time()),
            "filename": filename,
            "purpose": purpose,
            "status": "processed",
        }
        with self._lock:
            self.files[file_id] = {"object": record, "content": content}
        return file_id

    # -- batches ----------------------------------------------------------------------------------------------------

    def _create(self, request: dict[str, Any]) -> tuple[int, bytes, str]:
        input_file = self.files.get(str(request.get("input_file_id")))
        if input_file is None:
            return _error(400, "input_file_id does not name an uploaded file")
        if request.get("endpoint") != "/v1/chat/completions" or request.get("completion_window") != "24h":
            return _error(400, "endpoint must be /v1/chat/completions and completion_window 24h")
        batch_id = f"batch_{uuid.uuid4().hex[:24]}"
        now = int(time.time())
        batch = {
            "id": batch_id,
            "object": "batch",
            "endpoint": request["endpoint"],
            "errors": None,
            "input_file_id": request["input_file_id"],
            "completion_window": "24h",
            "status": "validating",
            "output_file_id": None,
            "error_file_id": None,
            "created_at": now,
            "in_progress_at": None,
            "expires_at": now + 86_400,
            "completed_at": None,
            "request_counts": {"total": 0, "completed": 0, "failed": 0},
            "metadata": request.get("metadata") or {},
        }
        with self._lock:
            outcome = self.script.outcomes.pop(0) if self.script.outcomes else "completed"
            self.batches[batch_id] = batch
            self.created.append(batch_id)
        threading.Thread(target=self._run, args=(batch_id, outcome), name=f"batch-{batch_id}", daemon=True).start()
        return 200, _json(batch), "application/json"

    def _set(self, batch_id: str, **changes: Any) -> dict[str, Any]:
        with self._lock:
            self.batches[batch_id].update(changes)
            return dict(self.batches[batch_id])

    def _run(self, batch_id: str, outcome: str) -> None:
        script = self.script
        self._stop.wait(script.validating_s)
        batch = self._set(batch_id, status="in_progress", in_progress_at=int(time.time()))
        content = self.files[batch["input_file_id"]]["content"]
        lines = [json.loads(line) for line in content.splitlines() if line.strip()]
        if outcome == "failed":  # validation refused the whole file
            errors = {"object": "list", "data": [{"code": "invalid_request", "message": "scripted: batch refused"}]}
            self._set(batch_id, status="failed", errors=errors, failed_at=int(time.time()))
            return
        self._stop.wait(script.in_progress_s)
        while not script.hold.wait(0.05):
            if self._stop.is_set():
                return
        with self._lock:
            cancelling = self.batches[batch_id]["status"] == "cancelling"
        answered = len(lines)
        if outcome in ("expired", "cancelled") or cancelling:
            answered = min(len(lines), script.expire_after_items)
        output, errors = [], []
        for index, line in enumerate(lines):
            if index >= answered:
                code = "batch_expired" if outcome == "expired" else "batch_cancelled"
                message = "This request could not be executed before the completion window expired."
                error = {"code": code, "message": message}
                errors.append({"id": f"req_{index}", "custom_id": line["custom_id"], "response": None, "error": error})
                continue
            status, body = self.answer(line["body"])
            item = {
                "id": f"req_{index}",
                "custom_id": line["custom_id"],
                "response": {"status_code": status, "request_id": f"r{index}", "body": body},
                "error": None,
            }
            (output if status < 400 else errors).append(item)
        changes: dict[str, Any] = {
            "request_counts": {"total": len(lines), "completed": len(output), "failed": len(errors)},
        }
        if output:
            changes["output_file_id"] = self._store_file(_jsonl(output), f"{batch_id}_output.jsonl", "batch_output")
        if errors:
            changes["error_file_id"] = self._store_file(_jsonl(errors), f"{batch_id}_error.jsonl", "batch_output")
        final = "cancelled" if cancelling else outcome
        stamp = {"completed": "completed_at", "expired": "expired_at", "cancelled": "cancelled_at"}[final]
        self._set(batch_id, status=final, **{stamp: int(time.time())}, **changes)


def _jsonl(items: list[dict[str, Any]]) -> bytes:
    return ("\n".join(json.dumps(item) for item in items) + "\n").encode()


def _json(value: Any) -> bytes:
    return json.dumps(value).encode()


def _error(status: int, message: str) -> tuple[int, bytes, str]:
    error = {"message": f"judge_server: {message}", "type": "invalid_request_error", "code": None}
    return status, _json({"error": error}), "application/json"
