"""A step waits for the commit of its own groups' spans, not for the newest: attempt_progress names, per
attempt, the newest commit of its status and call spans, which later commits of other rollouts leave as is."""

import time
import uuid

from test_forged_records import gateway_call, one_span
from test_rollout_isolation import export, kv

from otel_rl import attributes as attr
from otel_rl.store import reads


def test_an_attempts_commit_is_that_of_its_own_spans_not_the_newest(otel_rl_server) -> None:
    since = time.time_ns() - 60 * 10**9
    rollout_id = "commit-" + uuid.uuid4().hex[:8]
    group, attempt = rollout_id + "-g", rollout_id + "-a1"
    identity = [kv(attr.ROLLOUT_ID, rollout_id), kv(attr.GROUP_ID, group), kv(attr.ATTEMPT_ID, attempt)]
    status = [kv(attr.ROLLOUT_STATUS, "ok"), kv(attr.ROLLOUT_EXIT_CODE, 0)]
    span = one_span(attr.CONTROLLER_SCOPE, attr.ROLLOUT_SPAN_NAME, identity + status, time.time_ns())
    export(otel_rl_server, "traces", span, otel_rl_server.token, "protobuf")
    (own,) = (
        otel_rl_server.sql(f"SELECT max(commit_seq) AS c FROM spans WHERE attempt_id = '{attempt}'")
        .column("c")
        .to_pylist()
    )
    # another rollout's call, committed after: the attempt's reads need not wait for it
    other = gateway_call("other-" + rollout_id, "other-g")
    export(otel_rl_server, "traces", other, otel_rl_server.token, "protobuf")
    (newest,) = otel_rl_server.sql("SELECT max(commit_seq) AS c FROM spans").column("c").to_pylist()

    (progress,) = reads.attempt_progress(otel_rl_server.run, [attempt], since).to_dicts()
    assert progress["finished"] and progress["commit_seq"] == own < newest
