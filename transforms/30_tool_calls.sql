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

requested AS (
    SELECT
        c.rollout_id,
        c.trace_id,
        c.span_id,
        c.conversation,
        c.start_time_unix_nano,
        o.choice - 1 AS choice_index,
        t.position AS call_position,
        t.tool_call.id AS tool_call_id,
        t.tool_call.name AS name,
        t.tool_call.arguments AS arguments
    FROM calls c,
        unnest(c.outputs) WITH ORDINALITY AS o(message, choice),
        unnest(o.message.tool_calls) WITH ORDINALITY AS t(tool_call, position)
),

-- Tool messages in call inputs. Some libraries drop a tool message's call id (Traceloop's legacy
-- gen_ai.tool.message): it is then the k-th tool message after an assistant message answering that
-- message's k-th tool call, which is how the OpenAI chat format orders them.
input_messages AS (
    SELECT c.conversation, c.start_time_unix_nano, i.message, i.position
    FROM calls c, unnest(c.inputs) WITH ORDINALITY AS i(message, position)
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
