"""The committed framework captures are well formed: each decodes, is complete and matches its scenario."""

import importlib.util
import json
import re
import sys
from pathlib import Path

import httpx
import pytest
from opentelemetry.exporter.otlp.proto.http import Compression
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from otel_fixtures import FRAMEWORK_CAPTURES, framework_captures, requests_under
from packaging.utils import canonicalize_name

from otel_rl.attributes import ROLLOUT_ID
from otel_rl.collector.decode import decompress, encoding_of, parse_request

DRIVER = Path(__file__).parent / "captures" / "make_captures.py"
MAX_BODY_BYTES = 64 << 20
# What a scenario folder may hold: numbered request files, and the three files the driver writes.
REQUEST_FILE = re.compile(r"(?P<number>\d{2,})_(?P<signal>traces|logs|metrics)\.(bin|json)(\.gz|\.deflate)?")
SIDE_FILE = re.compile(r"\d{2,}_(traces|logs|metrics)\.(meta|decoded)\.json")
SCENARIO_FILES = {"README.md", "expected.json", "venv-freeze.txt"}


def load_driver():
    spec = importlib.util.spec_from_file_location("make_captures", DRIVER)
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("make_captures", module)
    spec.loader.exec_module(module)
    return module


driver = load_driver()
SCENARIOS = framework_captures()
IDS = [s.name for s in SCENARIOS]


def test_every_scenario_of_the_driver_has_its_capture_and_every_capture_its_scenario() -> None:
    # a run in progress stages its folder under a dot-name: not a capture yet
    folders = sorted(p.name for p in FRAMEWORK_CAPTURES.iterdir() if p.is_dir() and p.name[0] != ".")
    assert folders == driver.scenario_names()
    assert [s.name for s in SCENARIOS] == folders


@pytest.mark.parametrize("scenario", SCENARIOS, ids=IDS)
def test_every_body_decodes_with_the_project_decoder_to_its_decoded_json(scenario) -> None:
    assert scenario.requests, f"{scenario.name}: no OTLP request captured"
    for captured in scenario.requests:
        payload = decompress(captured.body, captured.content_encoding, max_bytes=MAX_BODY_BYTES)
        decoded = parse_request(captured.signal, payload, encoding_of(captured.content_type))
        assert decoded == captured.decoded, captured.name
        assert captured.record_count() > 0, captured.name


@pytest.mark.parametrize("scenario", SCENARIOS, ids=IDS)
def test_requests_are_numbered_in_arrival_order_with_their_meta_and_decoded_view(scenario) -> None:
    names = sorted(p.name for p in scenario.folder.iterdir())
    bodies = [m for m in map(REQUEST_FILE.fullmatch, names) if m]
    assert sorted(int(m["number"]) for m in bodies) == list(range(1, len(bodies) + 1))
    sides = [n for n in names if SIDE_FILE.fullmatch(n)]
    assert len(sides) == 2 * len(bodies)
    assert set(names) == {m.string for m in bodies} | set(sides) | SCENARIO_FILES
    for m in bodies:
        meta = json.loads((scenario.folder / f"{m['number']}_{m['signal']}.meta.json").read_text())
        assert (meta["signal"], meta["path"]) == (m["signal"], f"/v1/{m['signal']}")
        assert meta["content_length"] == (scenario.folder / m.string).stat().st_size


@pytest.mark.parametrize("scenario", SCENARIOS, ids=IDS)
def test_every_record_carries_the_scenarios_rollout_in_its_resource(scenario) -> None:
    for captured in scenario.requests:
        field = {"traces": "resource_spans", "logs": "resource_logs", "metrics": "resource_metrics"}
        for resource in (r.resource for r in getattr(captured.decoded, field[captured.signal])):
            attributes = {kv.key: kv.value.string_value for kv in resource.attributes}
            assert attributes.get(ROLLOUT_ID) == scenario.rollout_id, captured.name


@pytest.mark.parametrize("scenario", SCENARIOS, ids=IDS)
def test_expected_json_lists_the_scripted_replies_and_what_the_framework_ran(scenario) -> None:
    spec = driver.load_scenario(scenario.name)
    expected = scenario.expected
    assert (expected["scenario"], expected["rollout_id"]) == (spec.name, spec.rollout_id)
    replies = [call["reply"] for call in expected["model_calls"]]
    assert [(r["content"] or "") for r in replies] == [r.content for r in spec.replies]
    assert [[(c["name"], c["arguments"], c["id"]) for c in r["tool_calls"]] for r in replies] == [
        [(c.name, c.arguments, c.id) for c in r.tool_calls] for r in spec.replies
    ]
    assert all(call["request"]["roles"] for call in expected["model_calls"])
    assert expected["tools"], "the framework ran no tool"
    assert {"name", "arguments", "result"} <= set(expected["tools"][0])


@pytest.mark.parametrize("scenario", SCENARIOS, ids=IDS)
def test_readme_and_freeze_name_the_pinned_versions(scenario) -> None:
    spec = driver.load_scenario(scenario.name)
    readme = (scenario.folder / "README.md").read_text()
    frozen = {
        canonicalize_name(name): version
        for name, _, version in (
            line.partition("==") for line in (scenario.folder / "venv-freeze.txt").read_text().splitlines()
        )
    }
    for requirement in spec.requirements:
        assert requirement in readme, f"{scenario.name}: README.md does not name {requirement}"
        name, _, version = requirement.partition("==")
        assert frozen.get(canonicalize_name(name.split("[")[0])) == version, requirement
    assert spec.framework in readme and spec.instrumentation in readme


def test_the_receiver_saves_each_export_as_sent_answers_it_and_refuses_what_does_not_decode(tmp_path) -> None:
    logs_json = b'{"resourceLogs": [{"scopeLogs": [{"logRecords": [{"body": {"stringValue": "hi"}}]}]}]}'
    with driver.OTLPReceiver(tmp_path) as receiver:
        exporter = OTLPSpanExporter(endpoint=f"{receiver.endpoint}/v1/traces", compression=Compression.Gzip)
        provider = TracerProvider(resource=Resource({ROLLOUT_ID: "r1"}))
        provider.add_span_processor(SimpleSpanProcessor(exporter))
        provider.get_tracer("capture test").start_span("model call").end()
        provider.shutdown()
        answered = httpx.post(f"{receiver.endpoint}/v1/logs", content=logs_json,
                              headers={"Content-Type": "application/json"})  # fmt: skip
        refused = httpx.post(f"{receiver.endpoint}/v1/metrics", content=b"\xff not protobuf",
                             headers={"Content-Type": "application/x-protobuf"})  # fmt: skip

    assert answered.status_code == 200, answered.text
    assert (answered.headers["content-type"], answered.json()) == ("application/json", {})
    assert refused.status_code == 400 and receiver.errors and "metrics" in receiver.errors[0]
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "01_traces.bin.gz", "01_traces.decoded.json", "01_traces.meta.json",
        "02_logs.decoded.json", "02_logs.json", "02_logs.meta.json",
    ]  # fmt: skip
    assert (tmp_path / "02_logs.json").read_bytes() == logs_json
    traces, logs = requests_under(tmp_path, tmp_path)
    assert traces.content_encoding == "gzip" and traces.decoded == parse_request(
        "traces", decompress(traces.body, "gzip", max_bytes=MAX_BODY_BYTES), "protobuf"
    )
    [span] = traces.decoded.resource_spans[0].scope_spans[0].spans
    assert span.name == "model call"
    assert logs.decoded.resource_logs[0].scope_logs[0].log_records[0].body.string_value == "hi"
