"""What a model call produced, read from a vLLM response or assembled from its SSE chunks."""

from dataclasses import dataclass, field
from typing import Any


@dataclass
class ToolCallOutput:
    id: str | None = None
    name: str = ""
    arguments: str = ""  # JSON text, as the model wrote it


@dataclass
class ChoiceOutput:
    """One choice: its text, tool calls, sampled token ids and their logprobs."""

    text: str = ""
    reasoning: str = ""
    tool_calls: list[ToolCallOutput] = field(default_factory=list)
    token_ids: list[int] | None = None
    logprobs: list[float] | None = None
    finish_reason: str | None = None


@dataclass
class CallOutput:
    """A whole response in one shape for chat and completions, streamed or not."""

    response_id: str | None = None
    response_model: str | None = None
    prompt_token_ids: list[int] | None = None
    choices: list[ChoiceOutput] = field(default_factory=list)  # by choice index
    input_tokens: int | None = None
    output_tokens: int | None = None
    cache_read_tokens: int | None = None  # prompt tokens served from vLLM's prefix cache

    # A stream carries usage only if the client asked for it; the token ids count the same.
    def prompt_tokens(self) -> int | None:
        """The prompt's tokens: vLLM's usage, else its token ids' count."""
        if self.input_tokens is None and self.prompt_token_ids is not None:
            return len(self.prompt_token_ids)
        return self.input_tokens

    def completion_tokens(self) -> int | None:
        """The generated tokens: vLLM's usage, else the choices' token ids' count."""
        if self.output_tokens is None and all(choice.token_ids is not None for choice in self.choices):
            return sum(len(choice.token_ids or ()) for choice in self.choices)
        return self.output_tokens


def parse_chat_response(response: dict[str, Any]) -> CallOutput:
    """A non-streaming `chat.completion` response."""
    output = _head(response)
    output.prompt_token_ids = response.get("prompt_token_ids")
    for raw in sorted(response.get("choices") or [], key=lambda c: c.get("index", 0)):
        message = raw.get("message") or {}
        choice = ChoiceOutput(
            text=message.get("content") or "",
            reasoning=message.get("reasoning") or message.get("reasoning_content") or "",
            token_ids=raw.get("token_ids"),
            logprobs=_chat_logprobs(raw.get("logprobs")),
            finish_reason=raw.get("finish_reason"),
        )
        for call in message.get("tool_calls") or []:
            function = call.get("function") or {}
            choice.tool_calls.append(
                ToolCallOutput(call.get("id"), function.get("name") or "", function.get("arguments") or "")
            )
        output.choices.append(choice)
    return output


def parse_completion_response(response: dict[str, Any]) -> CallOutput:
    """A non-streaming `text_completion` response (the prompt ids are on each choice)."""
    output = _head(response)
    for raw in sorted(response.get("choices") or [], key=lambda c: c.get("index", 0)):
        token_ids = raw.get("token_ids")
        output.prompt_token_ids = output.prompt_token_ids or raw.get("prompt_token_ids")
        output.choices.append(
            ChoiceOutput(
                text=raw.get("text") or "",
                token_ids=token_ids,
                logprobs=_completion_logprobs(raw.get("logprobs"), token_ids),
                finish_reason=raw.get("finish_reason"),
            )
        )
    return output


class StreamAssembler:
    """Builds the CallOutput of a streamed call from its parsed SSE chunks, in arrival order."""

    def __init__(self, operation: str) -> None:
        self._chat = operation == "chat"
        self.output = CallOutput()
        self.finished = False  # the stream's `[DONE]` arrived

    def add(self, chunk: dict[str, Any]) -> None:
        output = self.output
        output.response_id = output.response_id or chunk.get("id")
        output.response_model = output.response_model or chunk.get("model")
        if chunk.get("usage"):
            _read_usage(output, chunk["usage"])
        if self._chat and output.prompt_token_ids is None:
            output.prompt_token_ids = chunk.get("prompt_token_ids")
        for raw in chunk.get("choices") or ():
            choice = self._choice(raw.get("index", 0))
            if raw.get("finish_reason"):
                choice.finish_reason = raw["finish_reason"]
            if raw.get("token_ids"):
                choice.token_ids = (choice.token_ids or []) + raw["token_ids"]
            if self._chat:
                self._add_chat_delta(choice, raw)
            else:
                self._add_completion_delta(choice, raw)

    def _choice(self, index: int) -> ChoiceOutput:
        while len(self.output.choices) <= index:
            self.output.choices.append(ChoiceOutput())
        return self.output.choices[index]

    @staticmethod
    def _add_chat_delta(choice: ChoiceOutput, raw: dict[str, Any]) -> None:
        delta = raw.get("delta") or {}
        choice.text += delta.get("content") or ""
        choice.reasoning += delta.get("reasoning") or delta.get("reasoning_content") or ""
        for call in delta.get("tool_calls") or ():
            index = call.get("index", 0)
            while len(choice.tool_calls) <= index:
                choice.tool_calls.append(ToolCallOutput())
            tool_call = choice.tool_calls[index]
            function = call.get("function") or {}
            tool_call.id = tool_call.id or call.get("id")
            tool_call.name += function.get("name") or ""
            tool_call.arguments += function.get("arguments") or ""
        logprobs = _chat_logprobs(raw.get("logprobs"))
        if logprobs:
            choice.logprobs = (choice.logprobs or []) + logprobs

    def _add_completion_delta(self, choice: ChoiceOutput, raw: dict[str, Any]) -> None:
        choice.text += raw.get("text") or ""
        if self.output.prompt_token_ids is None:
            self.output.prompt_token_ids = raw.get("prompt_token_ids")
        logprobs = (raw.get("logprobs") or {}).get("token_logprobs")
        if logprobs:
            choice.logprobs = (choice.logprobs or []) + logprobs


def _head(response: dict[str, Any]) -> CallOutput:
    output = CallOutput(response_id=response.get("id"), response_model=response.get("model"))
    if response.get("usage"):
        _read_usage(output, response["usage"])
    return output


def _read_usage(output: CallOutput, usage: dict[str, Any]) -> None:
    output.input_tokens = usage.get("prompt_tokens")
    output.output_tokens = usage.get("completion_tokens")
    output.cache_read_tokens = (usage.get("prompt_tokens_details") or {}).get("cached_tokens")


def _chat_logprobs(logprobs: dict[str, Any] | None) -> list[float] | None:
    if not logprobs or logprobs.get("content") is None:
        return None
    return [entry["logprob"] for entry in logprobs["content"]]


def _completion_logprobs(logprobs: dict[str, Any] | None, token_ids: list[int] | None) -> list[float] | None:
    if not logprobs or logprobs.get("token_logprobs") is None:
        return None
    values = logprobs["token_logprobs"]
    # With `echo` the prompt's logprobs come first; the sampled tokens are the last ones.
    return values[len(values) - len(token_ids) :] if token_ids is not None else values
