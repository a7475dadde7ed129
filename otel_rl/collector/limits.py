"""The sizes a client may declare in one record, checked at ingest before anything is allocated for them."""

# A key index is read as a list position (views build lists up to the highest index; call_tokens one list
# per choice): a single attribute declaring index 10^9 would otherwise allocate or scan 10^9 entries.
MAX_CHOICES = 128  # otel_rl.choices.{i}.*: i < 128, OpenAI's own maximum n
MAX_MESSAGES = 4096  # llm.{input,output}_messages.{i}., llm.tools.{i}., gen_ai.{prompt,completion}.{i}.
MAX_MESSAGE_PARTS = 128  # ...message.tool_calls.{j}., ...message.contents.{j}. (any index after the first)
# AnyValues inside AnyValues (arrays, key-value lists). Protobuf's own parser stops at 100 nested messages
# (about 47 nested arrays); real attributes and log bodies nest a few levels.
MAX_VALUE_DEPTH = 32
# OpenInference and legacy semconv content keys whose first segment after the prefix is an index.
INDEXED_PREFIXES = (
    "llm.input_messages.",
    "llm.output_messages.",
    "llm.tools.",
    "gen_ai.prompt.",
    "gen_ai.completion.",
)
# Longer digit strings are over every limit: not converted (int() refuses over 4300 digits, and is slow).
_MAX_INDEX_DIGITS = 9
_SHOWN_KEY_CHARS = 120


def is_index(segment: str) -> bool:
    """Whether a key segment is an index: ASCII decimal digits (the views' regular expressions read those)."""
    return segment.isascii() and segment.isdigit()


def _index(segment: str) -> int | None:
    """The value of an index segment, 10**9 for longer ones; None when it is not one (views ignore those)."""
    if not is_index(segment):
        return None
    return int(segment) if len(segment) <= _MAX_INDEX_DIGITS else 10**_MAX_INDEX_DIGITS


def _shown(text: str) -> str:
    """A client's key in an error message, cut short: the key itself may be megabytes."""
    return repr(text if len(text) <= _SHOWN_KEY_CHARS else text[:_SHOWN_KEY_CHARS] + "...")


def check_indexed_key(key: str, prefix: str) -> None:
    """Raise ValueError when a content key under `prefix` declares an index over its limit."""
    segments = key[len(prefix) :].split(".")
    first = _index(segments[0])
    if first is not None and first >= MAX_MESSAGES:
        raise ValueError(f"attribute {_shown(key)} has an index over the limit of {MAX_MESSAGES} entries")
    for segment in segments[1:]:
        nested = _index(segment)
        if nested is not None and nested >= MAX_MESSAGE_PARTS:
            raise ValueError(
                f"attribute {_shown(key)} has a nested index over the limit of {MAX_MESSAGE_PARTS} entries"
            )


def choice_index(key: str, segment: str) -> int:
    """The choice index of a packed token attribute `otel_rl.choices.{segment}.*` (an index segment)."""
    index = _index(segment)
    if index is None or index >= MAX_CHOICES:
        raise ValueError(
            f"attribute {_shown(key)} has a choice index over the limit of {MAX_CHOICES} choices"
        )
    return index
