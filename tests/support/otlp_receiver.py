"""A real OTLP/HTTP receiver on 127.0.0.1: decodes the protobuf trace and log exports it is sent."""

from __future__ import annotations

import gzip
import threading
from typing import Any

from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from tests.support.loopback import LoopbackHTTPServer, QuietHandler


class OtlpReceiver:
    def __init__(self) -> None:
        self.spans: list[Any] = []
        self.logs: list[Any] = []
        self.status = 200  # what the receiver answers; anything else records nothing (a collector that is down)
        self.lock = threading.Lock()
        receiver = self

        class Handler(QuietHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("content-length") or 0))
                if receiver.status != 200:
                    self.send_response(receiver.status)
                    self.send_header("content-length", "0")
                    self.end_headers()
                    return
                if self.headers.get("content-encoding") == "gzip":
                    body = gzip.decompress(body)
                if self.path == "/v1/traces":
                    request = ExportTraceServiceRequest.FromString(body)
                    with receiver.lock:
                        for rs in request.resource_spans:
                            for ss in rs.scope_spans:
                                receiver.spans.extend(ss.spans)
                elif self.path == "/v1/logs":
                    logs = ExportLogsServiceRequest.FromString(body)
                    with receiver.lock:
                        for rl in logs.resource_logs:
                            for sl in rl.scope_logs:
                                receiver.logs.extend(sl.log_records)
                else:
                    self.send_response(404)
                    self.end_headers()
                    return
                self.send_response(200)
                self.send_header("content-type", "application/x-protobuf")
                self.send_header("content-length", "0")
                self.end_headers()

        self._http = LoopbackHTTPServer(Handler)

    @property
    def endpoint(self) -> str:
        return self._http.url

    def __enter__(self) -> OtlpReceiver:
        self._http.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._http.stop()


def attributes(item: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for kv in item.attributes:
        kind = kv.value.WhichOneof("value")
        if kind == "array_value":
            out[kv.key] = [getattr(v, v.WhichOneof("value")) for v in kv.value.array_value.values]
        elif kind is not None:
            out[kv.key] = getattr(kv.value, kind)
    return out
