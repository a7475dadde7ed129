"""A coding harness for the probe tests: asks the served model (through the gateway, with its rollout key)
to fix the task, and writes the reply into `notes.md` in its workspace; the grader outside decides."""

import json
import os
import sys
from pathlib import Path

import openai


def main() -> None:
    task = json.loads(os.environ["OTEL_RL_TASK"])
    reply = openai.OpenAI().chat.completions.create(
        model=sys.argv[1],
        messages=[{"role": "user", "content": task["problem_statement"]}],
        max_tokens=16,
    )
    Path("notes.md").write_text(reply.choices[0].message.content or "")


if __name__ == "__main__":
    main()
