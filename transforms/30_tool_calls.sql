-- tool_calls: one row per tool call a model asked for (in a call's output messages), with the result the
-- harness sent back: the tool message answering it in a later call's input of the same rollout (or, without
-- rollout identity, of the same trace); joined to the tool span that ran it (step_spans), and one row per
-- tool span that no recorded model call asked for.

CREATE OR REPLACE VIEW tool_calls AS
WITH calls AS (
    SELECT
        trace_id,
        span_id,
        rollout_id,
        coalesce(rollout_id, trace_id) AS conversation,
        start_time_unix_nano,
        messages_of(input_messages) AS inputs,
        messages_of(output_messages) AS outputs
    FROM llm_calls
),

-- Lists are unnested in the select list (unnest beside generate_subscripts, which gives each element's
-- position): a lateral unnest in FROM is planned as a join of every row with its own elements, which
-- cost more than the rest of this view.
output_messages AS (
    SELECT *, unnest(outputs) AS message, generate_subscripts(outputs, 1) AS choice
    FROM calls
),
requested_calls AS (
    SELECT
        *,
        unnest(message.tool_calls) AS tool_call,
        generate_subscripts(message.tool_calls, 1) AS call_position
    FROM output_messages
),
requested AS (
    SELECT
        rollout_id,
        trace_id,
        span_id,
        conversation,
        start_time_unix_nano,
        choice - 1 AS choice_index,
        call_position,
        tool_call.id AS tool_call_id,
        tool_call.name AS name,
        tool_call.arguments AS arguments
    FROM requested_calls
),

-- Tool messages in call inputs. Some libraries drop a tool message's call id (Traceloop's legacy
-- gen_ai.tool.message): it is then the k-th tool message after an assistant message answering that
-- message's k-th tool call, which is how the OpenAI chat format orders them.
input_messages AS (
    SELECT
        conversation,
        start_time_unix_nano,
        unnest(inputs) AS message,
        generate_subscripts(inputs, 1) AS position
    FROM calls
),
placed AS (
    SELECT
        *,
        max(CASE WHEN message.role = 'assistant' THEN position END)
            OVER (PARTITION BY conversation, start_time_unix_nano ORDER BY position) AS assistant_position
    FROM input_messages
),
answers AS (
    SELECT
        t.conversation,
        t.start_time_unix_nano,
        coalesce(
            t.message.tool_call_id,
            a.message.tool_calls[
                row_number() OVER (PARTITION BY t.conversation, t.start_time_unix_nano, t.assistant_position
                                   ORDER BY t.position)
            ].id
        ) AS tool_call_id,
        t.message.content AS result,
        a.message.tool_calls AS asked_calls
    FROM placed t
    LEFT JOIN input_messages a
      ON a.conversation = t.conversation AND a.start_time_unix_nano = t.start_time_unix_nano
     AND a.position = t.assistant_position
    WHERE t.message.role = 'tool'
),
-- each answer with the name and arguments of the call it answers, as the later call's input repeats it:
-- the match for an answer whose request had no call id (LiteLLM's legacy tool-call attributes)
named_answers AS (
    SELECT
        * EXCLUDE (asked_calls),
        [c FOR c IN asked_calls IF c.id = tool_call_id][1] AS answered
    FROM answers
),
asked AS (
    SELECT
        r.*,
        -- the first later call that carries the answer
        coalesce(
            (SELECT min_by(a.result, a.start_time_unix_nano) FROM named_answers a
              WHERE a.conversation = r.conversation AND a.tool_call_id = r.tool_call_id
                AND a.start_time_unix_nano > r.start_time_unix_nano),
            (SELECT min_by({'id': a.tool_call_id, 'result': a.result}, a.start_time_unix_nano).result
               FROM named_answers a
              WHERE r.tool_call_id IS NULL AND a.conversation = r.conversation AND a.answered.name = r.name
                AND a.answered.arguments = r.arguments AND a.start_time_unix_nano > r.start_time_unix_nano)
        ) AS answer,
        row_number() OVER (PARTITION BY r.conversation, r.name
                           ORDER BY r.start_time_unix_nano, r.choice_index, r.call_position) AS ordinal
    FROM requested r
),
-- Tool spans, matched to the call that asked by call id, else (libraries that record none) as the k-th run
-- of the tool in the rollout for its k-th request.
ran AS (
    SELECT
        t.* REPLACE (coalesce(t.arguments, h.arguments) AS arguments, coalesce(t.result, h.result) AS result),
        coalesce(i.rollout_id, t.trace_id) AS conversation,
        i.rollout_id,
        row_number() OVER (PARTITION BY coalesce(i.rollout_id, t.trace_id), t.tool_name
                           ORDER BY t.start_time_unix_nano) AS ordinal
    FROM step_spans t
    LEFT JOIN span_identity i USING (trace_id, span_id)
    -- a coding CLI's tool result record, by call id, in the span's trace
    LEFT JOIN harness_tool_results h ON h.tool_call_id = t.tool_call_id AND h.trace_id = t.trace_id
        AND h.rollout_id IS NOT DISTINCT FROM i.rollout_id
    WHERE t.kind = 'tool'
)

SELECT
    coalesce(r.rollout_id, t.rollout_id) AS rollout_id,
    r.trace_id,
    r.span_id,
    r.choice_index,
    coalesce(r.tool_call_id, t.tool_call_id) AS tool_call_id,
    coalesce(r.name, t.tool_name) AS name,
    coalesce(r.arguments, t.arguments) AS arguments,
    coalesce(r.answer, t.result) AS result,
    t.trace_id AS tool_trace_id,
    t.span_id AS tool_span_id
FROM asked r
FULL JOIN ran t ON t.conversation = r.conversation AND t.tool_name = r.name
    AND (t.tool_call_id = r.tool_call_id OR (t.tool_call_id IS NULL AND t.ordinal = r.ordinal));
