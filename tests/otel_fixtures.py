"""The captured OTLP/HTTP requests of tests/captures/otel/: bodies, headers and decoded protos."""

import json
from dataclasses import dataclass
from pathlib import Path

from otel_rl.collector.decode import REQUEST_TYPES, ExportRequest, Signal, parse_otlp_json

# Committed with the tests (tests/captures/otel/README.md says which libraries, versions and runs made them).
FIXTURES = Path(__file__).parent / "captures" / "otel"


@dataclass(frozen=True)
class CapturedRequest:
    """One captured export: the body as sent, its headers, and the request it decodes to."""

    name: str
    signal: Signal
    body: bytes
    content_type: str
    content_encoding: str | None
    decoded: ExportRequest

    @property
    def headers(self) -> dict[str, str]:
        headers = {"Content-Type": self.content_type}
        if self.content_encoding:
            headers["Content-Encoding"] = self.content_encoding
        return headers

    def record_count(self) -> int:
        """Spans, log records or metric data points in the request."""
        d = self.decoded
        if self.signal == "traces":
            return sum(len(ss.spans) for rs in d.resource_spans for ss in rs.scope_spans)
        if self.signal == "logs":
            return sum(len(sl.log_records) for rl in d.resource_logs for sl in rl.scope_logs)
        return sum(
            len(getattr(m, m.WhichOneof("data")).data_points)
            for rm in d.resource_metrics
            for sm in rm.scope_metrics
            for m in sm.metrics
        )


def captured_requests() -> list[CapturedRequest]:
    """Every captured request body (.bin, .json, .gz), sorted by path."""
    found = []
    for meta_path in sorted(FIXTURES.rglob("*.meta.json")):
        meta = json.loads(meta_path.read_text())
        stem = meta_path.name.removesuffix(".meta.json")
        (body_path,) = [
            p
            for p in meta_path.parent.glob(f"{stem}.*")
            if not p.name.endswith((".meta.json", ".decoded.json"))
        ]
        decoded_path = meta_path.parent / f"{stem}.decoded.json"
        found.append(
            CapturedRequest(
                name=str(body_path.relative_to(FIXTURES)),
                signal=meta["signal"],
                body=body_path.read_bytes(),
                content_type=meta["content_type"],
                content_encoding=meta.get("content_encoding"),
                decoded=parse_otlp_json(REQUEST_TYPES[meta["signal"]], decoded_path.read_bytes()),
            )
        )
    return found
