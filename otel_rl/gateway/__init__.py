"""The OpenAI-compatible gateway in front of vLLM: routing, call recording, rollout keys, weight reloads."""
