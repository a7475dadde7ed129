"""The calculator task: problems, a seeded train/held-out split, task files, the checker, the noisy expert."""

import json
import operator
import random
import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

OPERATORS = {"+": operator.add, "-": operator.sub, "*": operator.mul}
OPERATOR_NAMES = {"+": "add", "-": "sub", "*": "mul"}
OPERANDS = range(10, 100)
PHRASINGS = (
    "What is {a} {op} {b}?",
    "Compute {a} {op} {b}.",
    "Calculate {a} {op} {b}, please.",
    "How much is {a} {op} {b}?",
    "Work out {a} {op} {b} for me.",
)
HELDOUT_SIZE = 200
_PROBLEM_IN_TEXT = re.compile(r"(\d+) ([-+*]) (\d+)")
_INTEGER = re.compile(r"-?\d+")


@dataclass(frozen=True, order=True)
class Problem:
    """`a op b` with two-digit operands."""

    a: int
    op: str
    b: int

    @property
    def answer(self) -> int:
        return OPERATORS[self.op](self.a, self.b)


def all_problems() -> list[Problem]:
    """Every (a, op, b): 90 × 3 × 90 problems."""
    return [Problem(a, op, b) for a in OPERANDS for op in OPERATORS for b in OPERANDS]


def split_problems(seed: int = 0) -> tuple[list[Problem], list[Problem]]:
    """(train, held-out): HELDOUT_SIZE problems drawn with `seed`; no held-out (a, op, b) is in train."""
    problems = all_problems()
    random.Random(seed).shuffle(problems)
    return sorted(problems[HELDOUT_SIZE:]), sorted(problems[:HELDOUT_SIZE])


def task_record(problem: Problem, phrasing: int, split: str) -> dict[str, Any]:
    """A task as the harness receives it (JSON in OTEL_RL_TASK): the question and what the checker needs."""
    return {
        "id": f"{OPERATOR_NAMES[problem.op]}-{problem.a}-{problem.b}-p{phrasing}",
        "split": split,
        "question": PHRASINGS[phrasing].format(a=problem.a, op=problem.op, b=problem.b),
        "a": problem.a,
        "op": problem.op,
        "b": problem.b,
        "answer": problem.answer,
    }


def sample_tasks(problems: list[Problem], n: int, split: str, seed: int) -> list[dict[str, Any]]:
    """n tasks drawn (with replacement) from `problems`, each with a random phrasing."""
    rng = random.Random(seed)
    return [task_record(rng.choice(problems), rng.randrange(len(PHRASINGS)), split) for _ in range(n)]


def heldout_tasks(seed: int = 0) -> list[dict[str, Any]]:
    """The HELDOUT_SIZE held-out problems, each once, with a seeded phrasing."""
    rng = random.Random(seed + 1)
    return [task_record(p, rng.randrange(len(PHRASINGS)), "val") for p in split_problems(seed)[1]]


def write_tasks(path: Path, tasks: Iterable[dict[str, Any]]) -> Path:
    """Write tasks as JSONL, one per line (the `tasks` file of the training config)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(task) + "\n" for task in tasks))
    return path


def check(task: dict[str, Any], final_answer: str | None, called_tool: bool) -> float:
    """The reward: 1.0 if the calculator was called and the final message's last integer is the answer."""
    numbers = _INTEGER.findall(final_answer or "")
    return float(called_tool and bool(numbers) and int(numbers[-1]) == task["answer"])


def expert_reply(messages: list[dict[str, Any]], rng: random.Random) -> dict[str, Any]:
    """The noisy scripted expert's next assistant message (OpenAI shape) for a calculator conversation.

    Noise by operator, so that the wrong behaviour is common exactly where RL should fix it: `+` copies the
    tool result correctly 85% of the time (else miscopies it); `-` calls the tool with the operands in order
    40% of the time (else swapped); `*` calls the tool 35% of the time (else answers a made-up number).
    """
    last = messages[-1]
    if last["role"] == "tool":
        result = str(last.get("content") or "")
        if not _INTEGER.fullmatch(result.strip()):
            return {"role": "assistant", "content": "I could not compute it."}
        value = int(result)
        question = next(m for m in messages if m["role"] == "user")["content"]
        if _problem_in(question).op == "+" and rng.random() >= 0.85:
            value += rng.choice((-10, -1, 1, 10))
        return {"role": "assistant", "content": f"The answer is {value}."}

    problem = _problem_in(str(last.get("content") or ""))
    a, b = problem.a, problem.b
    if problem.op == "-" and rng.random() >= 0.40:
        a, b = b, a
    if problem.op == "*" and rng.random() >= 0.35:
        made_up = rng.randint(100, 9801)
        made_up += made_up == problem.answer
        return {"role": "assistant", "content": f"The answer is {made_up}."}
    arguments = json.dumps({"expression": f"{a}{problem.op}{b}"})
    call = {"id": f"call_{rng.getrandbits(32):08x}", "type": "function"}
    call["function"] = {"name": "calc", "arguments": arguments}
    return {"role": "assistant", "content": None, "tool_calls": [call]}


def _problem_in(text: str) -> Problem:
    match = _PROBLEM_IN_TEXT.search(text)
    if match is None:
        raise ValueError(f"no 'a op b' problem in {text!r}")
    return Problem(int(match[1]), match[2], int(match[3]))
