-- tool_calls: one row per tool call a model asked for (in a call's output messages), with the result the
-- harness sent back: the tool message answering it in a later call's input of the same rollout (or, without
-- rollout identity, of the same trace).

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
        t.message.content AS result
    FROM placed t
    LEFT JOIN input_messages a
      ON a.conversation = t.conversation AND a.start_time_unix_nano = t.start_time_unix_nano
     AND a.position = t.assistant_position
    WHERE t.message.role = 'tool'
)

SELECT
    r.rollout_id,
    r.trace_id,
    r.span_id,
    r.choice_index,
    r.tool_call_id,
    r.name,
    r.arguments,
    -- the first later call that carries the answer
    (SELECT min_by(a.result, a.start_time_unix_nano) FROM answers a
      WHERE a.conversation = r.conversation AND a.tool_call_id = r.tool_call_id
        AND a.start_time_unix_nano > r.start_time_unix_nano) AS result
FROM requested r;
