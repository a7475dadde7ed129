"""Attribute, event and header names that are otel-rl's public API (see docs/attributes.md)."""

# Rollout identity: on the rollout's root span, copied from W3C baggage onto every span,
# or given as OTel resource attributes (OTEL_RESOURCE_ATTRIBUTES) for zero-code harnesses.
ROLLOUT_ID = "otel_rl.rollout.id"
ATTEMPT_ID = "otel_rl.attempt.id"
GROUP_ID = "otel_rl.group.id"
TASK_ID = "otel_rl.task.id"
SPLIT = "otel_rl.split"  # "train" | "val"
IDENTITY_KEYS = (ROLLOUT_ID, ATTEMPT_ID, GROUP_ID, TASK_ID, SPLIT)

# Rollout outcome as recorded by the rollout controller (or the SDK's rollout span).
# "ok" | "error" | "timeout" | "crashed" | "infra_error" | "truncated"
ROLLOUT_STATUS = "otel_rl.rollout.status"
ROLLOUT_EXIT_CODE = "otel_rl.rollout.exit_code"
ROLLOUT_SPAN_NAME = "otel_rl.rollout"
# The harness's rollout span, opened by `otel_rl.rollout()` (scope SDK_SCOPE); ERROR when its block raised.
SDK_ROLLOUT_SPAN_NAME = "rollout"
# Why an episode was cut short ("time", "harness_limit"): such a rollout is left out of training, never
# scored 0.
ROLLOUT_TRUNCATED = "otel_rl.rollout.truncated"

# A coding rollout's sandbox (resource attributes of its harness, and on the controller's rollout span):
# the mode ("bubblewrap", or "unsandboxed" by name) and its limits, SANDBOX_LIMITS + cpu_seconds |
# memory_bytes | processes | file_bytes | wall_seconds. And the grader's verdict, on the controller's span
# (otel_rl/controller/coding.py).
SANDBOX_MODE = "otel_rl.sandbox.mode"
SANDBOX_LIMITS = "otel_rl.sandbox.limits."
# What a coding sandbox's network denied (otel_rl/coding/forward.py), on the controller's rollout span: the
# count, and one event per recorded attempt (network.transport, server.address, server.port,
# dns.question.name).
SANDBOX_DENIED_CONNECTS = "otel_rl.sandbox.denied_connects"
SANDBOX_DENIED_EVENT = "otel_rl.sandbox.denied_connect"
CODING_INSTANCE = "otel_rl.coding.instance_id"
GRADE_OUTCOME = "otel_rl.grade.outcome"  # "graded" | "infrastructure_error" | "not_graded"
GRADE_REWARD = "otel_rl.grade.reward"
GRADE_TESTS_PASSED = "otel_rl.grade.tests_passed"
GRADE_TESTS_TOTAL = "otel_rl.grade.tests_total"
GRADE_DROPPED_PATHS = "otel_rl.grade.dropped_paths"
GRADE_ERROR = "otel_rl.grade.error"

# Rewards: the GenAI semantic-convention evaluation event.
EVALUATION_EVENT = "gen_ai.evaluation.result"
EVALUATION_NAME = "gen_ai.evaluation.name"
EVALUATION_SCORE_VALUE = "gen_ai.evaluation.score.value"
EVALUATION_SCORE_LABEL = "gen_ai.evaluation.score.label"
EVALUATION_EXPLANATION = "gen_ai.evaluation.explanation"
REWARD_SOURCE = "otel_rl.reward.source"  # who produced the reward: "grader", "harness", ...
# The source of every reward sent with a rollout key (the collector rewrites what its sender wrote: the agent
# must not pass its own reward off as a grader's), and the default of POST /v1/rewards (admin token only).
REWARD_SOURCE_HARNESS = "harness"
REWARD_SOURCE_GRADER = "grader"

# Token data written by the gateway on its span for each call. Packed arrays: little-endian
# int32 ids, float32 logprobs (as OTLP bytes values); {i} is the choice index.
PROMPT_TOKEN_IDS = "otel_rl.prompt_token_ids"
CHOICE_TOKEN_IDS = "otel_rl.choices.{i}.token_ids"
CHOICE_LOGPROBS = "otel_rl.choices.{i}.logprobs"
POLICY_VERSION = "otel_rl.policy.version"
SAMPLING_PARAMS = "otel_rl.sampling.params"  # JSON of the sampling parameters actually sent
SERVER_URL = "otel_rl.server.url"  # the vLLM server that answered
# Whether vLLM sampled from a constrained distribution (forced tool choice, response format, grammar, logit
# bias, penalties...), which of the request's fields constrained it, and what the recorded logprobs are:
# sampling | rescored | constrained (otel_rl/gateway/rescoring.py)
DECODING_CONSTRAINED = "otel_rl.decoding.constrained"
DECODING_CONSTRAINTS = "otel_rl.decoding.constraints"
LOGPROBS_SOURCE = "otel_rl.logprobs.source"
# The API the harness called: chat_completions | completions | messages | responses (the last two are
# recorded as the chat call they were translated into)
GATEWAY_API = "otel_rl.gateway.api"

GATEWAY_SCOPE = "otel_rl.gateway"
CONTROLLER_SCOPE = "otel_rl.controller"
SDK_SCOPE = "otel_rl.sdk"

# Gateway: rollout identity as HTTP headers (for harnesses that send neither baggage nor a rollout key),
# and the span that records each synchronized weight reload (attributes otel_rl.reload.*).
IDENTITY_HEADERS = {
    ROLLOUT_ID: "x-otel-rl-rollout-id",
    ATTEMPT_ID: "x-otel-rl-attempt-id",
    GROUP_ID: "x-otel-rl-group-id",
    TASK_ID: "x-otel-rl-task-id",
    SPLIT: "x-otel-rl-split",
}
RELOAD_SPAN_NAME = "otel_rl.reload"

# Online training records (scope TRAIN_SCOPE): one span per optimizer step and one per evaluation, with
# otel_rl.policy.version, the run id, and every figure of the record as otel_rl.train.<name>
# (otel_rl.train.trainer.<name> for the trainer's own metrics); see docs/training.md.
TRAIN_SCOPE = "otel_rl.train"
TRAIN_STEP_SPAN_NAME = "otel_rl.train.step"
TRAIN_EVAL_SPAN_NAME = "otel_rl.train.eval"
TRAIN_RUN_ID = "otel_rl.train.run_id"
TRAIN_PREFIX = "otel_rl.train."
# The reward an online run trains on (its `reward` settings: RewardSpec's name, trusted sources and rule), on
# its otel_rl.train.run span (sent at its start) and on every record: the rollouts view shows the run's
# rollouts' reward by it (transforms/45_reward_specs.sql), only from a sender the server vouches for.
TRAIN_RUN_SPAN_NAME = "otel_rl.train.run"
TRAIN_REWARD_NAME = "otel_rl.train.reward.name"
TRAIN_REWARD_RULE = "otel_rl.train.reward.rule"
TRAIN_REWARD_TRUSTED_SOURCES = "otel_rl.train.reward.trusted_sources"
