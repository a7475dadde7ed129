"""What a rollout's identity values and a reward value may be: one rule for every route that takes them.

Identity values (otel_rl.rollout.id, .attempt.id, .group.id, .task.id, .split) are 1 to MAX_ID_CHARS
characters, all printable: no control character (NUL, newline, escape), no format character (bidirectional
overrides, zero-width marks), no line or paragraph separator, nothing unassigned or private-use. A reward
value is a finite number: JSON `true` or the text "1" is not one. See docs/attributes.md#identity-values.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated

from pydantic import AfterValidator, Field

from otel_rl.attributes import IDENTITY_KEYS

MAX_ID_CHARS = 256


def id_problem(value: str) -> str | None:
    """Why `value` is not an identity value, or None when it is one."""
    if not value:
        return "is empty"
    if len(value) > MAX_ID_CHARS:
        return f"is {len(value)} characters long, over the limit of {MAX_ID_CHARS}"
    # str.isprintable is False for exactly the categories refused (Cc, Cf, Cs, Co, Cn, Zl, Zp, Zs but ' ').
    if not value.isprintable():
        refused = next(c for c in value if not c.isprintable())
        return f"holds the unprintable character U+{ord(refused):04X}"
    return None


def check_id(value: str, name: str = "the id") -> str:
    """`value` if it is an identity value; else ValueError naming `name` and what is wrong."""
    problem = id_problem(value)
    if problem is not None:
        raise ValueError(f"{name} {problem}")
    return value


def check_identity(identity: Mapping[str, str | None]) -> None:
    """ValueError naming the first identity attribute (otel_rl.* key) whose value is not an identity value."""
    for key in IDENTITY_KEYS:
        value = identity.get(key)
        if value is not None:
            check_id(value, key)


# A pydantic field holding an identity value: refused with a 422 that says why.
IdValue = Annotated[str, AfterValidator(check_id)]
# A reward: a finite JSON number. Strict: `true` and "1" are refused, not read as 1.0.
RewardValue = Annotated[float, Field(strict=True, allow_inf_nan=False, description="a finite number")]
