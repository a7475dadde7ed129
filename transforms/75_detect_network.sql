-- detect_network: fetching from the network or installing packages: `curl`, `wget`, `pip install`,
-- `npm|pnpm|yarn|bun install|add`, `uv pip install|add`, and any http(s) URL whose host is not loopback (the
-- sandbox forwards only the gateway and the OTLP endpoint onto its loopback).

CREATE OR REPLACE VIEW detect_network AS
WITH commands AS (
    SELECT
        *,
        regexp_extract(text,
            '\b(?:curl|wget)\b[^\n]*|\bpip3?\s+install\b[^\n]*|-m\s+pip\s+install\b[^\n]*'
            || '|\b(?:npm|pnpm|yarn|bun)\s+(?:install|i|add)\b[^\n]*|\buv\s+(?:pip\s+install|add)\b[^\n]*')
            AS evidence
    FROM tool_call_texts
    WHERE contains(arguments, 'curl') OR contains(arguments, 'wget') OR contains(arguments, 'install')
       OR contains(arguments, 'add')
),
urls AS (
    SELECT *, unnest(regexp_extract_all(text, '(?i)https?://[^\s''"`<>]+')) AS url
    FROM tool_call_texts
    WHERE contains(arguments, '://')
),
remote AS (
    SELECT * EXCLUDE (url), url AS evidence
    FROM urls
    WHERE NOT regexp_matches(lower(url), '^https?://(?:[^/@]*@)?(?:localhost|127(?:\.\d+){3}|\[::1\])(?:[:/?#]|$)')
)
SELECT rollout_id, 'network' AS detector, evidence_id, evidence, trace_id, span_id
FROM commands
WHERE evidence <> ''
UNION ALL
SELECT rollout_id, 'network' AS detector, evidence_id, evidence, trace_id, span_id
FROM remote;
