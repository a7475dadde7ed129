"""The gateway hands each call's span to the collector's flattener as the server's own: its rows must equal
what the collector makes of the same span exported over OTLP by the OpenTelemetry SDK (as a harness sends
it), byte for byte, identity columns included."""

from concurrent.futures import Future

import pyarrow as pa
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from otel_rl.attributes import GATEWAY_SCOPE
from otel_rl.auth import ADMIN, Principal
from otel_rl.collector.export import sender_of
from otel_rl.collector.flatten import traces_to_tables
from otel_rl.gateway.attribution import trace_parent
from otel_rl.gateway.export import gateway_tracer_provider
from otel_rl.gateway.outputs import CallOutput, ChoiceOutput, ToolCallOutput
from otel_rl.gateway.recording import CallRecord, record_call
from otel_rl.gateway.span_rows import CallSpanWriter
from otel_rl.gateway.upstream import upstream_body
from otel_rl.store.layout import SPANS

TRACEPARENT = {
    "traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
    "tracestate": "vendor=abc,other=1",
}


def records() -> list[CallRecord]:
    chat = {
        "model": "tiny",
        "messages": [{"role": "user", "content": "What is 2 + 2?"}],
        "tools": [{"type": "function", "function": {"name": "calc", "parameters": {}}}],
        "n": 2,
        "stop": ["\n"],
        "temperature": 0.5,
    }
    sent, _ = upstream_body("chat", chat, {"temperature": 1.0, "top_k": -1}, None)
    now = 1_767_225_600_000_000_000
    ok = CallRecord("chat", chat, sent, {"otel_rl.rollout.id": "r1", "otel_rl.split": "train"},
                    trace_parent(TRACEPARENT), 3, now, "http://127.0.0.1:8000", now + 5_000_000)  # fmt: skip
    ok.output = CallOutput(
        "chatcmpl-1", "tiny", [1, 2, 3],
        [ChoiceOutput("4", token_ids=[7, 8], logprobs=[-0.5, float("-inf")], finish_reason="stop"),
         ChoiceOutput("", tool_calls=[ToolCallOutput("c1", "calc", '{"e": "2+2"}')], token_ids=[9],
                      logprobs=[-1.25], finish_reason="tool_calls")],
        input_tokens=3, output_tokens=3, cache_read_tokens=2,
    )  # fmt: skip
    ok.time_to_first_chunk_s = 0.002
    completion = {"model": "tiny", "prompt": "2 + 2 =", "max_tokens": 4}
    sent, _ = upstream_body("text_completion", completion, {}, "otel-rl-policy")
    failed = CallRecord("text_completion", completion, sent, {}, trace_parent({}), 0, now, None, now + 1)
    failed.error_type, failed.error_message = "upstream_timeout", "the inference server did not answer"
    no_tokens = CallRecord("chat", chat, sent, {}, None, 1, now, "http://127.0.0.1:8000", now + 2)
    no_tokens.output = CallOutput("chatcmpl-2", "tiny", None, [ChoiceOutput("hi", finish_reason="stop")])
    return [ok, failed, no_tokens]


def rows(tables: dict[str, pa.Table]) -> dict[str, pa.Table]:
    """The tables without the time they were stored at."""
    return {name: t.drop_columns(["received_at"]) for name, t in tables.items()}


def stored(batch: dict[str, pa.Table], batches: list, *, dedup: bool) -> Future:
    assert not dedup, "the gateway's spans are new by construction: the store need not look for them"
    batches.append(batch)
    future = Future()
    future.set_result(None)
    return future


def test_the_gateways_rows_are_the_collectors_rows_of_the_sdk_span():
    batches = []
    forwarded = InMemorySpanExporter()
    provider = gateway_tracer_provider(
        lambda request: None, flush_ms=10, forward=SimpleSpanProcessor(forwarded)
    )
    writer = CallSpanWriter(
        lambda batch, **options: stored(batch, batches, **options),
        provider.resource,
        flush_ms=10,
        forward=SimpleSpanProcessor(forwarded),
    )
    for record in records():
        writer.write(record)
    writer.close()
    written = {name: pa.concat_tables(b[name] for b in batches) for name in ("spans", "call_tokens")}
    assert written["spans"].num_rows == 3 and written["call_tokens"].num_rows == 1

    # The span forwarded over OTLP (same ids) is what the rows say.
    via_otlp = traces_to_tables(
        encode_spans(forwarded.get_finished_spans()), written["spans"]["received_at"][0], "server"
    )
    assert rows(written) == rows(via_otlp)

    # And it is the span the SDK's tracer makes of the same call (ids aside: the SDK draws its own).
    made_by_sdk = InMemorySpanExporter()
    provider = gateway_tracer_provider(
        lambda request: None, flush_ms=10, forward=SimpleSpanProcessor(made_by_sdk)
    )
    for record in records():
        record_call(provider.get_tracer(GATEWAY_SCOPE), record)
    via_sdk = rows(traces_to_tables(encode_spans(made_by_sdk.get_finished_spans()), None, "server"))
    ids = ["span_id", "trace_id"]
    assert rows(written)["spans"].drop_columns(ids) == via_sdk["spans"].drop_columns(ids)
    assert rows(written)["spans"]["trace_id"][0] == via_sdk["spans"]["trace_id"][0]  # the caller's trace
    assert rows(written)["call_tokens"].drop_columns(ids) == via_sdk["call_tokens"].drop_columns(ids)

    # One layout and one identity rule: the call's identity in the identity columns, the server as the sender.
    spans = written["spans"]
    assert spans.schema == SPANS.schema
    assert spans.select(["rollout_id", "split"]).to_pylist()[0] == {"rollout_id": "r1", "split": "train"}
    assert set(spans["sender"].to_pylist()) == set(written["call_tokens"]["sender"].to_pylist()) == {"server"}


def test_a_network_export_is_never_the_servers() -> None:
    """Only the in-process writer marks rows as the server's: an export over the network is the admin's or a
    rollout key's, whatever it holds (the collector sets the sender from the credential)."""
    assert sender_of(ADMIN) == "admin"
    assert sender_of(Principal(admin=False, rollout_id="r1", identity={})) == "rollout"
