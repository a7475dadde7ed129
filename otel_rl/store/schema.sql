-- Raw OTLP tables: every field an exporter sends, one row per span / log record / metric data point.
-- JSON columns hold OTLP key-value lists as objects ({"key": value}); AnyValue maps to JSON
-- (string, bool, int, double, array, kvlist -> object, bytes -> base64 string).
-- A span's attributes are split in two objects that together hold every attribute: `content_attributes`
-- holds those carrying a call's content (gen_ai.input.messages, gen_ai.output.messages,
-- gen_ai.system_instructions, gen_ai.tool.definitions, input.value, output.value and the keys under
-- llm.input_messages., llm.output_messages., llm.tools., gen_ai.prompt., gen_ai.completion.;
-- otel_rl/collector/flatten.py CONTENT_ATTRIBUTES), `attributes` the rest, so that reading ids, models or
-- usage never parses message text.
-- Timestamps are kept as the exporter sent them (unsigned nanoseconds since the epoch; an end before its
-- start is stored as the start).

CREATE TABLE IF NOT EXISTS spans (
    trace_id                VARCHAR NOT NULL,   -- 32 lowercase hex
    span_id                 VARCHAR NOT NULL,   -- 16 lowercase hex
    parent_span_id          VARCHAR,            -- NULL for a root span
    trace_state             VARCHAR,
    flags                   UINTEGER,
    name                    VARCHAR,
    kind                    TINYINT,            -- OTLP SpanKind: 0 unspecified, 1 internal, 2 server, 3 client, 4 producer, 5 consumer
    start_time_unix_nano    UBIGINT,
    end_time_unix_nano      UBIGINT,
    attributes              JSON,               -- every attribute but the content ones (above)
    content_attributes      JSON,               -- the content attributes, NULL when none
    dropped_attributes_count UINTEGER,
    events                  JSON,               -- [{"time_unix_nano", "name", "attributes", "dropped_attributes_count"}]
    dropped_events_count    UINTEGER,
    links                   JSON,               -- [{"trace_id", "span_id", "trace_state", "attributes", "dropped_attributes_count", "flags"}]
    dropped_links_count     UINTEGER,
    status_code             TINYINT,            -- 0 unset, 1 ok, 2 error
    status_message          VARCHAR,
    resource_attributes     JSON,
    resource_dropped_attributes_count UINTEGER,
    resource_schema_url     VARCHAR,
    scope_name              VARCHAR,
    scope_version           VARCHAR,
    scope_attributes        JSON,
    scope_schema_url        VARCHAR,
    received_at             TIMESTAMPTZ
);

-- Packed token arrays (otel_rl.prompt_token_ids, otel_rl.choices.{i}.token_ids / .logprobs) decoded
-- at ingest from the span's bytes attributes into typed lists; one row per span that carried them.
CREATE TABLE IF NOT EXISTS call_tokens (
    trace_id          VARCHAR NOT NULL,
    span_id           VARCHAR NOT NULL,
    prompt_token_ids  INTEGER[],
    choice_token_ids  INTEGER[][],   -- one list per choice, by choice index
    choice_logprobs   FLOAT[][],     -- sampled-token logprobs, aligned with choice_token_ids
    received_at       TIMESTAMPTZ    -- as its span's
);
-- Stores made before call_tokens had received_at: add it, and take it from the rows' spans.
ALTER TABLE call_tokens ADD COLUMN IF NOT EXISTS received_at TIMESTAMPTZ;
UPDATE call_tokens SET received_at = s.received_at
FROM spans s
WHERE call_tokens.received_at IS NULL AND s.trace_id = call_tokens.trace_id AND s.span_id = call_tokens.span_id;

CREATE TABLE IF NOT EXISTS logs (
    content_key             VARCHAR NOT NULL,   -- hash of the record with its resource and scope: the dedup key
    seq                     UBIGINT,            -- ingest order (records of one request keep their order)
    time_unix_nano          UBIGINT,            -- 0 when the exporter sent none (common: use observed time)
    observed_time_unix_nano UBIGINT,
    severity_number         INTEGER,
    severity_text           VARCHAR,
    event_name              VARCHAR,
    body                    JSON,
    attributes              JSON,
    dropped_attributes_count UINTEGER,
    flags                   UINTEGER,
    trace_id                VARCHAR,            -- NULL when absent
    span_id                 VARCHAR,            -- NULL when absent
    resource_attributes     JSON,
    resource_dropped_attributes_count UINTEGER,
    resource_schema_url     VARCHAR,
    scope_name              VARCHAR,
    scope_version           VARCHAR,
    scope_attributes        JSON,
    scope_schema_url        VARCHAR,
    received_at             TIMESTAMPTZ
);

CREATE TABLE IF NOT EXISTS metric_points (
    content_key             VARCHAR NOT NULL,
    metric_name             VARCHAR,
    description             VARCHAR,
    unit                    VARCHAR,
    metric_metadata         JSON,
    type                    VARCHAR,            -- gauge | sum | histogram | exponential_histogram | summary
    aggregation_temporality TINYINT,
    is_monotonic            BOOLEAN,
    start_time_unix_nano    UBIGINT,
    time_unix_nano          UBIGINT,
    attributes              JSON,
    value                   DOUBLE,             -- gauge / sum points
    count                   UBIGINT,            -- histogram / summary points
    sum                     DOUBLE,
    min                     DOUBLE,
    max                     DOUBLE,
    point                   JSON,               -- the whole data point (buckets, quantiles, exemplars, flags)
    resource_attributes     JSON,
    resource_schema_url     VARCHAR,
    scope_name              VARCHAR,
    scope_version           VARCHAR,
    scope_attributes        JSON,
    scope_schema_url        VARCHAR,
    received_at             TIMESTAMPTZ
);
