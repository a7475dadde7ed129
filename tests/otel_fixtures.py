"""The committed OTLP/HTTP captures (tests/captures/otel/, frameworks/): bodies, headers, decoded protos."""

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from otel_rl.collector.decode import REQUEST_TYPES, ExportRequest, Signal, parse_otlp_json

# Committed with the tests (tests/captures/otel/README.md says which libraries, versions and runs made them).
FIXTURES = Path(__file__).parent / "captures" / "otel"
# One folder per agent framework scenario, made by tests/captures/make_captures.py (its README.md lists them).
FRAMEWORK_CAPTURES = Path(__file__).parent / "captures" / "frameworks"
# One folder per coding CLI's rollout through the gateway, made by tests/captures/make_cli_captures.py.
CLI_CAPTURES = Path(__file__).parent / "captures" / "cli"


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
    """Every captured request body (.bin, .json, .gz) of tests/captures/otel/, sorted by path."""
    return requests_under(FIXTURES, FIXTURES)


def requests_under(folder: Path, root: Path) -> list[CapturedRequest]:
    """The captured requests below `folder`, in arrival order (each folder's NN_ prefix, not the text: 100
    comes after 99) and named relative to `root`."""
    found = []
    in_order = sorted(folder.rglob("*.meta.json"), key=lambda p: (p.parent, int(p.name.split("_", 1)[0])))
    for meta_path in in_order:
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
                name=str(body_path.relative_to(root)),
                signal=meta["signal"],
                body=body_path.read_bytes(),
                content_type=meta["content_type"],
                content_encoding=meta.get("content_encoding"),
                decoded=parse_otlp_json(REQUEST_TYPES[meta["signal"]], decoded_path.read_bytes()),
            )
        )
    return found


@dataclass(frozen=True)
class Scenario:
    """One agent framework run: its exports in arrival order, what the scripted server and the framework did.

    `expected` (expected.json): `rollout_id`; `model_calls`, in order, each `{"request": {"messages", "roles",
    "tools", "stream"}, "reply": {"content", "tool_calls": [{"name", "arguments", "id"}], "finish_reason"}}`;
    `tools` the framework ran (`{"name", "arguments", "result"}`), in order; `agents` it ran (names).
    """

    name: str
    folder: Path
    requests: list[CapturedRequest]
    expected: dict[str, Any]

    @property
    def rollout_id(self) -> str:
        return self.expected["rollout_id"]


def framework_scenario(name: str) -> Scenario:
    folder = FRAMEWORK_CAPTURES / name
    expected = json.loads((folder / "expected.json").read_text())
    return Scenario(name, folder, requests_under(folder, FRAMEWORK_CAPTURES), expected)


def framework_captures() -> list[Scenario]:
    """Every captured framework scenario, by name."""
    folders = sorted(p for p in FRAMEWORK_CAPTURES.iterdir() if p.is_dir() and not p.name.startswith("."))
    return [framework_scenario(p.name) for p in folders]
