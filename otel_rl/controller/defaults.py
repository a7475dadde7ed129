"""The rollout limits' defaults: one definition for the controller (ControllerSettings) and the training
configuration's `online` section, which `otel-rl train` and `otel-rl rollouts run` read."""

CONCURRENCY = 16  # harness processes at a time
TIMEOUT_S = 120.0  # per attempt; a coding CLI needs more (its own timeout plus the check): set it
MAX_ATTEMPTS = 3  # attempts per rollout, counting retries of timeouts, crashes and infrastructure errors
