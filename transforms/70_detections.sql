-- Hack detectors (docs/coding.md "Detectors"): each `detect_<name>` view (files 71_detect_*.sql, and any file a
-- user adds) yields one row per piece of evidence, in the shape of `detections` below. When the store opens,
-- after every file ran, `detections` is replaced by the union of every view whose name starts with `detect_`
-- (otel_rl/store/detections.py): a new detector is one new SQL file. `hack_flags` holds one row per flagged
-- rollout. These are plain views, computed when queried, never kept as tables.

-- A test file or test configuration, preceded by the start of the text or a character no path holds (so
-- that `contest.py` and `mytests/` are not): `tests/`, `test_*.py`, `*_test.py`, `conftest.py`, `pytest.ini`,
-- `tox.ini`, `setup.cfg`, `sitecustomize.py`, `usercustomize.py`, `*.pth` (the grader drops the same paths).
-- test_path_body() is the path alone, for use right after a delimiter (a quote, `>`, `File: `).
CREATE OR REPLACE MACRO test_path_body() AS
    '(?:[\w.-]+/)*(?:tests?/[\w./-]*|test_[\w.-]*\.py|[\w.-]*_test\.py|conftest\.py|pytest\.ini|'
    || 'tox\.ini|setup\.cfg|sitecustomize\.py|usercustomize\.py|[\w.-]+\.pth)';
CREATE OR REPLACE MACRO test_path_re() AS '(?:^|[^\w.-])' || test_path_body();

-- Every tool call's text as the model wrote it: the string values of its JSON arguments (nested ones
-- included: an edit list, Codex's command vector), one per line, or the arguments as sent when they are not
-- JSON (a custom tool's free-form input, such as Codex's apply_patch); `trace_id`, `span_id`: the model call
-- that asked for it, else its tool span. `arguments` is the text as sent: a detector tests it first with a
-- cheap `contains` (pushed down to the scan), so that only the calls it may match have their JSON parsed.
CREATE OR REPLACE VIEW tool_call_texts AS
WITH calls AS (
    SELECT
        t.rollout_id,
        coalesce(t.trace_id, t.tool_trace_id) AS trace_id,
        coalesce(t.span_id, t.tool_span_id) AS span_id,
        t.tool_call_id,
        t.name,
        t.arguments,
        t.result,
        CASE WHEN json_valid(t.arguments) THEN t.arguments::JSON END AS args
    FROM tool_calls t
    WHERE t.rollout_id IS NOT NULL AND t.arguments IS NOT NULL
),
parsed AS (
    SELECT *, json_extract(args, '$..*') AS leaves FROM calls
)
SELECT
    c.rollout_id,
    c.trace_id,
    c.span_id,
    -- one tool call of the rollout: its call id, else its span
    coalesce(c.tool_call_id, c.span_id) AS evidence_id,
    c.name,
    c.arguments,
    coalesce(list_aggr([v ->> '$' FOR v IN c.leaves IF json_type(v) = 'VARCHAR'], 'string_agg', chr(10)),
             c.arguments) AS text,
    -- the file a file tool names (Claude Code's Write/Edit, opencode's write/edit, the GenAI tools' path)
    coalesce(c.args ->> 'file_path', c.args ->> 'filePath', c.args ->> 'path', c.args ->> 'absolute_path',
             c.args ->> 'filename') AS path,
    c.args ->> 'command' AS command,
    c.result
FROM parsed c;

-- The shape every detector's rows have. Replaced when the store opens by the union of the `detect_*` views.
CREATE OR REPLACE VIEW detections AS
SELECT
    NULL::VARCHAR AS rollout_id,
    NULL::VARCHAR AS detector,     -- the detector's name (its view's name without `detect_`, by convention)
    NULL::VARCHAR AS evidence_id,  -- the tool call id (else span id) or reward span that shows it
    NULL::VARCHAR AS evidence,     -- the matched text
    NULL::VARCHAR AS trace_id,     -- the span that holds the evidence (its attempt and time come from it)
    NULL::VARCHAR AS span_id
WHERE false;

CREATE OR REPLACE VIEW hack_flags AS
-- the attempt and the time of each piece of evidence, joined here: only flagged rows pay for the joins
WITH placed AS (
    SELECT d.*, i.attempt_id, s.start_time_unix_nano
    FROM detections d
    LEFT JOIN span_identity i ON i.trace_id = d.trace_id AND i.span_id = d.span_id
    LEFT JOIN spans s ON s.trace_id = d.trace_id AND s.span_id = d.span_id
),
firsts AS (
    SELECT
        rollout_id,
        detector,
        any_value(attempt_id) FILTER (WHERE attempt_id IS NOT NULL) AS attempt_id,
        count(*) AS n_evidence,
        arg_min({'evidence_id': evidence_id, 'evidence': evidence},
                (coalesce(start_time_unix_nano, 18446744073709551615::UBIGINT), evidence_id, evidence)) AS first
    FROM placed
    WHERE rollout_id IS NOT NULL
    GROUP BY rollout_id, detector
)
SELECT
    rollout_id,
    any_value(attempt_id) FILTER (WHERE attempt_id IS NOT NULL) AS attempt_id,
    list(detector ORDER BY detector) AS detectors,
    list({'detector': detector, 'evidence_id': first.evidence_id, 'evidence': first.evidence,
          'n_evidence': n_evidence} ORDER BY detector) AS evidence
FROM firsts
GROUP BY rollout_id;
