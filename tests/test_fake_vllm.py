"""The fake vLLM server speaks vLLM's protocol to the official openai client (what other tests rely on)."""

import httpx
import openai
import pytest
from fake_vllm import (
    MODEL,
    CalcReplies,
    FakeVLLM,
    Fault,
    Reply,
    ToolCall,
    logprob_of,
    render_chat,
    tokenize,
    tool_call_text,
)

MESSAGES = [{"role": "system", "content": "Be terse."}, {"role": "user", "content": "What is 37 + 48?"}]
TOOLS = [{"type": "function", "function": {"name": "calc", "parameters": {"type": "object"}}}]
VLLM_EXTRAS = {"return_token_ids": True}


def client(fake: FakeVLLM, **options) -> openai.OpenAI:
    return openai.OpenAI(base_url=fake.url, api_key="x", max_retries=0, **options)


def test_chat_returns_byte_token_ids_and_logprobs_like_vllm(fake_vllm):
    fake_vllm.script(["The answer is 85."])
    response = client(fake_vllm).chat.completions.create(
        model=MODEL, messages=MESSAGES, logprobs=True, top_logprobs=2, extra_body=VLLM_EXTRAS
    )
    choice = response.choices[0]
    assert choice.message.content == "The answer is 85."
    assert response.prompt_token_ids == tokenize(render_chat(MESSAGES))
    assert choice.token_ids == tokenize("The answer is 85.")
    assert [e.logprob for e in choice.logprobs.content] == [logprob_of(t) for t in choice.token_ids]
    assert len(choice.logprobs.content[0].top_logprobs) == 2
    assert response.usage.completion_tokens == len(choice.token_ids)
    assert fake_vllm.requests[0].body["messages"] == MESSAGES


def test_streamed_chat_with_n_2_carries_prompt_ids_first_and_each_deltas_ids(fake_vllm):
    fake_vllm.script(lambda request, index: f"Choice {index} says hello.")
    stream = client(fake_vllm).chat.completions.create(
        model=MODEL, messages=MESSAGES, n=2, stream=True, stream_options={"include_usage": True},
        extra_body=VLLM_EXTRAS,
    )  # fmt: skip
    chunks = list(stream)
    assert chunks[0].prompt_token_ids == tokenize(render_chat(MESSAGES))
    texts, ids, finish = ["", ""], [[], []], [None, None]
    for chunk in chunks:
        for c in chunk.choices:
            texts[c.index] += c.delta.content or ""
            ids[c.index] += getattr(c, "token_ids", None) or []
            finish[c.index] = c.finish_reason or finish[c.index]
    assert texts == ["Choice 0 says hello.", "Choice 1 says hello."]
    assert ids == [tokenize(t) for t in texts]
    assert finish == ["stop", "stop"]
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == sum(map(len, ids))


def test_tool_calls_are_parsed_when_tools_are_offered_else_left_in_the_text(fake_vllm):
    fake_vllm.script(CalcReplies())
    parsed = client(fake_vllm).chat.completions.create(model=MODEL, messages=MESSAGES, tools=TOOLS)
    call = parsed.choices[0].message.tool_calls[0]
    assert (call.function.name, call.function.arguments) == ("calc", '{"expression": "37+48"}')
    assert parsed.choices[0].finish_reason == "tool_calls"
    plain = client(fake_vllm).chat.completions.create(model=MODEL, messages=MESSAGES)
    assert plain.choices[0].message.content == tool_call_text("calc", {"expression": "37+48"})
    assert plain.choices[0].finish_reason == "stop"


def test_streamed_tool_call_arguments_and_token_ids_add_up(fake_vllm):
    fake_vllm.script([Reply(tool_calls=(ToolCall("calc", {"expression": "2*3"}),))])
    stream = client(fake_vllm).chat.completions.create(
        model=MODEL, messages=MESSAGES, tools=TOOLS, stream=True, extra_body=VLLM_EXTRAS
    )
    arguments, ids = "", []
    for chunk in stream:
        for c in chunk.choices:
            ids += getattr(c, "token_ids", None) or []
            for delta in c.delta.tool_calls or []:
                arguments += delta.function.arguments or ""
    assert arguments == '{"expression": "2*3"}'
    assert ids == tokenize(tool_call_text("calc", {"expression": "2*3"}))


def test_completions_put_prompt_and_completion_ids_in_each_choice(fake_vllm):
    fake_vllm.script(["world", "world"])
    response = client(fake_vllm).completions.create(
        model=MODEL, prompt="hello ", max_tokens=8, logprobs=1, extra_body=VLLM_EXTRAS
    )
    choice = response.choices[0]
    assert choice.text == "world"
    assert (choice.prompt_token_ids, choice.token_ids) == (tokenize("hello "), tokenize("world"))
    assert choice.logprobs.token_logprobs == [logprob_of(t) for t in tokenize("world")]
    stream = client(fake_vllm).completions.create(
        model=MODEL, prompt="hello ", stream=True, extra_body=VLLM_EXTRAS
    )
    chunks = [c.choices[0] for c in stream]
    assert chunks[0].prompt_token_ids == tokenize("hello ")
    assert "".join(c.text for c in chunks) == "world" and chunks[-1].finish_reason == "stop"


def test_max_tokens_truncates_and_finishes_with_length(fake_vllm):
    fake_vllm.script(["The answer is 85."])
    response = client(fake_vllm).chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=3)
    assert (response.choices[0].message.content, response.choices[0].finish_reason) == ("The", "length")


def test_unknown_model_gets_vllms_404_error_body(fake_vllm):
    with pytest.raises(openai.NotFoundError) as raised:
        client(fake_vllm).chat.completions.create(model="does-not-exist", messages=MESSAGES)
    assert raised.value.body["message"] == "The model `does-not-exist` does not exist."


def test_injected_faults_status_delay_and_disconnect(fake_vllm):
    fake_vllm.inject(Fault(status=503, message="busy"), Fault(delay_s=1.0), Fault(disconnect_after_chunks=3))
    with pytest.raises(openai.InternalServerError) as raised:
        client(fake_vllm).chat.completions.create(model=MODEL, messages=MESSAGES)
    assert raised.value.status_code == 503 and raised.value.body["type"] == "ServiceUnavailableError"
    with pytest.raises(openai.APITimeoutError):
        client(fake_vllm, timeout=0.2).chat.completions.create(model=MODEL, messages=MESSAGES)
    stream = client(fake_vllm).chat.completions.create(model=MODEL, messages=MESSAGES, stream=True)
    with pytest.raises(openai.APIError):
        list(stream)
    assert (
        client(fake_vllm).chat.completions.create(model=MODEL, messages=MESSAGES).choices[0].message.content
    )


def test_models_and_health_endpoints(fake_vllm):
    assert [m.id for m in client(fake_vllm).models.list()] == [MODEL]
    assert httpx.get(f"{fake_vllm.base_url}/health").status_code == 200
