-- harness_sessions: one row per session of a coding CLI (Codex's conversation.id, Claude Code's and Qwen
-- Code's session.id, opencode's), from its own log records and spans: the prompts it was given, its model
-- requests, their usage, its tool results (docs/views.md "harness_sessions"). The calls themselves are in
-- llm_calls (the CLIs' call spans; the gateway's rows when the CLI ran through it), joined by rollout_id.

CREATE OR REPLACE VIEW harness_sessions AS
WITH records AS (
    SELECT
        coalesce(attributes ->> 'event.name', body ->> '$') AS event_name,
        coalesce(attributes ->> 'conversation.id', attributes ->> 'session.id') AS session_id,
        attributes,
        rollout_id,
        resource_attributes ->> 'service.name' AS service_name,
        scope_name,
        coalesce(nullif(time_unix_nano, 0), observed_time_unix_nano) AS time_ns
    FROM logs
    -- a text test first: only records naming a session have their attributes read
    WHERE contains(attributes::VARCHAR, '"conversation.id"')
       OR contains(attributes::VARCHAR, '"session.id"')
),
events AS (
    SELECT
        *,
        CASE WHEN starts_with(event_name, 'codex.') THEN 'codex'
             WHEN starts_with(scope_name, 'com.anthropic.claude_code') THEN 'claude_code'
             WHEN scope_name = 'qwen-code' OR starts_with(event_name, 'qwen-code.') THEN 'qwen_code'
             ELSE coalesce(service_name, scope_name) END AS harness,
        regexp_replace(event_name, '^(codex|claude_code|qwen-code)\.', '') AS event
    FROM records
    WHERE session_id IS NOT NULL
),
classified AS (
    SELECT
        *,
        (event = 'sse_event' AND attributes ->> 'event.kind' = 'response.completed')
            OR (harness <> 'codex' AND event IN ('api_request', 'api_response')) AS is_usage
    FROM events
)
SELECT
    harness,
    session_id,
    any_value(rollout_id) AS rollout_id,
    any_value(service_name) AS service_name,
    any_value(attributes ->> 'model') FILTER (WHERE attributes ->> 'model' IS NOT NULL) AS model,
    list(coalesce(attributes ->> 'prompt', attributes ->> 'prompt_text') ORDER BY time_ns)
        FILTER (WHERE event = 'user_prompt') AS prompts,
    -- Codex also names its response.completed record api_request: a request is the record with a status
    count(*) FILTER (WHERE event = 'api_request' AND (harness <> 'codex'
                     OR attributes ->> 'http.response.status_code' IS NOT NULL)) AS n_api_requests,
    -- usage: Codex's response.completed SSE records, Claude Code's api_request, Qwen Code's api_response
    sum(coalesce(TRY_CAST(attributes ->> 'input_token_count' AS BIGINT),
                 TRY_CAST(attributes ->> 'input_tokens' AS BIGINT))) FILTER (WHERE is_usage)::BIGINT
        AS input_tokens,
    sum(coalesce(TRY_CAST(attributes ->> 'output_token_count' AS BIGINT),
                 TRY_CAST(attributes ->> 'output_tokens' AS BIGINT))) FILTER (WHERE is_usage)::BIGINT
        AS output_tokens,
    sum(coalesce(TRY_CAST(attributes ->> 'cached_token_count' AS BIGINT),
                 TRY_CAST(attributes ->> 'cached_content_token_count' AS BIGINT),
                 TRY_CAST(attributes ->> 'cache_read_tokens' AS BIGINT))) FILTER (WHERE is_usage)::BIGINT
        AS cache_read_tokens,
    count(*) FILTER (WHERE event IN ('tool_result', 'tool_call')) AS n_tool_results,
    ns_time(min(time_ns)) AS started_at,
    ns_time(max(time_ns)) AS ended_at
FROM classified
GROUP BY harness, session_id;
