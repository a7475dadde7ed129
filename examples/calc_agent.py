"""The calculator agent: a tool-using agent on the official openai client, traced for otel-rl.

It asks the model the task's question, runs the `calc` tool calls the model makes, sends back the
results, and rewards the final message (1 if calc was used and its last integer is the answer, else 0).
otel-rl needs three lines: `otel_rl.instrument()`, `with otel_rl.rollout(...) as r:`, `r.reward(...)`.

    OPENAI_BASE_URL=http://127.0.0.1:4318/v1 OPENAI_API_KEY=$(cat .otel_rl/token) \\
        python examples/calc_agent.py --task-json '{"question": "What is 37 + 48?", "answer": 85}'

The task is a JSON object with at least `question` and `answer` (examples/calc_task.py makes them);
under the rollout controller it arrives in OTEL_RL_TASK.
"""

import argparse
import json
import os
import re
from dataclasses import dataclass
from typing import Any

from calc_task import OPERATORS, check  # the calculator task, beside this file
from openai import OpenAI

import otel_rl

MAX_TURNS = 4
MAX_TOKENS = 128
TOOL_CALL = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)
EXPRESSION = re.compile(r"\s*(-?\d+)\s*([-+*])\s*(-?\d+)\s*")


def calc(expression: str) -> str:
    """The tool: `a op b` with integers and + - * (no eval)."""
    match = EXPRESSION.fullmatch(expression)
    if not match:
        return f"error: cannot evaluate {expression!r}"
    a, op, b = match.groups()
    return str(OPERATORS[op](int(a), int(b)))


@dataclass(frozen=True)
class CalcCall:
    id: str | None  # the OpenAI tool call id; None for a call written in the text
    expression: str | None  # None when the call is malformed or not a calc call


def parse_tool_calls(message: Any) -> list[CalcCall]:
    """The message's tool calls: OpenAI `tool_calls`, else `<tool_call>{"name": "calc", "arguments":
    {"expression": "37+48"}}</tool_call>` in the text (the format the calculator model writes)."""
    if message.tool_calls:
        return [
            CalcCall(call.id, calc_expression(call.function.name, json_value(call.function.arguments)))
            for call in message.tool_calls
        ]
    return [CalcCall(None, text_call_expression(text)) for text in TOOL_CALL.findall(message.content or "")]


def text_call_expression(text: str) -> str | None:
    call = json_value(text)
    return calc_expression(call.get("name"), call.get("arguments")) if isinstance(call, dict) else None


def calc_expression(name: Any, arguments: Any) -> str | None:
    expression = arguments.get("expression") if isinstance(arguments, dict) else None
    return expression if name == "calc" and isinstance(expression, str) else None


def json_value(text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return None


def solve(client: OpenAI, model: str, question: str, temperature: float) -> tuple[str | None, bool]:
    """Run the agent loop; returns (the final message, or None after MAX_TURNS; whether calc ran)."""
    messages: list[dict[str, Any]] = [{"role": "user", "content": question}]
    used_tool = False
    for _ in range(MAX_TURNS):
        response = client.chat.completions.create(
            model=model, messages=messages, temperature=temperature, max_tokens=MAX_TOKENS
        )
        message = response.choices[0].message
        calls = parse_tool_calls(message)
        if not calls:
            return message.content, used_tool
        messages.append(message.model_dump(include={"role", "content", "tool_calls"}, exclude_none=True))
        for call in calls:
            result = calc(call.expression) if call.expression is not None else "error: malformed calc call"
            used_tool |= not result.startswith("error")
            messages.append(
                {"role": "tool", "content": result} | ({"tool_call_id": call.id} if call.id else {})
            )
    return None, used_tool


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--task-json", default=os.environ.get("OTEL_RL_TASK"), help="default: $OTEL_RL_TASK")
    parser.add_argument("--model", help="default: the first model the server lists")
    parser.add_argument("--temperature", type=float, default=1.0)
    args = parser.parse_args()
    if not args.task_json:
        parser.error("give --task-json or set OTEL_RL_TASK")
    task = json.loads(args.task_json)

    otel_rl.instrument()
    client = OpenAI()  # OPENAI_BASE_URL, OPENAI_API_KEY
    with otel_rl.rollout(task_id=task.get("id"), split=task.get("split")) as r:
        model = args.model or client.models.list().data[0].id
        final, used_tool = solve(client, model, task["question"], args.temperature)
        reward = check(task, final, used_tool)
        r.reward(reward, explanation=f"final message {final!r}; calc used: {used_tool}")
    print(json.dumps({"rollout_id": r.rollout_id, "reward": reward, "final": final}))


if __name__ == "__main__":
    main()
