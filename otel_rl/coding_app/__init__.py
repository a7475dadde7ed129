"""The coding environment's commands and demo (`otel-rl tasks|sandbox|grade`, `otel-rl demo coding`): they
drive the server and the trainer over the environment in otel_rl/coding/, which imports nothing of them."""
