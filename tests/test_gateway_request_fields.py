"""Every request field of every API the gateway serves is bounded or classified as free, and the lists follow
the APIs: a field new in OpenAI's or Anthropic's SDK, in vLLM's request models, or newly read by a
translation fails here until it is classified (otel_rl/gateway/request_fields.py). Also the media URL rule
against the URL forms that parsers read differently, and the documentation of every limit."""

import json
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
from openai.types import completion_create_params
from openai.types.chat import completion_create_params as chat_create_params
from openai.types.responses import response_create_params

from otel_rl.gateway import messages, responses
from otel_rl.gateway.limits import RequestLimits, url_problem
from otel_rl.gateway.request_fields import FIELDS, NOT_TRANSLATED
from otel_rl.gateway.vllm_env import vllm_python

ROOT = Path(__file__).resolve().parent.parent

# vLLM's request models, and Anthropic's SDK (in vLLM's environment, which depends on it), as field names.
VLLM_FIELDS = """
import json
from anthropic.types import message_count_tokens_params, message_create_params
from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
from vllm.entrypoints.openai.completion.protocol import CompletionRequest
def keys(typed): return sorted(typed.__required_keys__ | typed.__optional_keys__)
print(json.dumps({
    "chat_completions": sorted(ChatCompletionRequest.model_fields),
    "completions": sorted(CompletionRequest.model_fields),
    "messages": keys(message_create_params.MessageCreateParamsBase)
    + keys(message_count_tokens_params.MessageCountTokensParams),
}))
"""


def typed_dict_keys(*typed: Any) -> set[str]:
    return {key for t in typed for key in t.__required_keys__ | t.__optional_keys__}


OPENAI_FIELDS = {
    "chat_completions": typed_dict_keys(
        chat_create_params.CompletionCreateParamsStreaming,
        chat_create_params.CompletionCreateParamsNonStreaming,
    ),
    "completions": typed_dict_keys(
        completion_create_params.CompletionCreateParamsStreaming,
        completion_create_params.CompletionCreateParamsNonStreaming,
    ),
    "responses": typed_dict_keys(
        response_create_params.ResponseCreateParamsStreaming,
        response_create_params.ResponseCreateParamsNonStreaming,
    ),
}


def unclassified(api: str, names: set[str]) -> set[str]:
    return names - FIELDS[api].keys()


@pytest.mark.parametrize("api", sorted(OPENAI_FIELDS))
def test_every_field_of_openais_request_types_is_bounded_or_classified_free(api):
    assert OPENAI_FIELDS[api]  # the SDK's types were read
    assert unclassified(api, OPENAI_FIELDS[api]) == set()


def test_every_field_of_vllms_request_models_and_anthropics_is_bounded_or_classified_free():
    found = subprocess.run(
        [str(vllm_python()), "-c", VLLM_FIELDS], capture_output=True, text=True, timeout=300, check=True
    )
    models = json.loads(found.stdout.strip().splitlines()[-1])
    assert {"n", "max_tokens", "messages", "prompt"} <= set(models["chat_completions"]) | set(
        models["completions"]
    )
    for api, names in models.items():
        assert unclassified(api, set(names)) == set(), api


class Reading(dict):
    """A request body that records every key the code reads from it."""

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.read: set[str] = set()

    def get(self, key: str, default: Any = None) -> Any:
        self.read.add(key)
        return super().get(key, default)

    def __getitem__(self, key: str) -> Any:
        self.read.add(key)
        return super().__getitem__(key)

    def __contains__(self, key: object) -> bool:
        self.read.add(str(key))
        return super().__contains__(key)


# Bodies that take every branch of the translations (each field set to a value the translation uses).
FULL_MESSAGES = {
    "model": "m",
    "max_tokens": 4096,
    "system": [{"type": "text", "text": "Be brief."}],
    "messages": [
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "f", "input": {}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "ok"}]},
    ],
    "stop_sequences": ["END"],
    "temperature": 0.5,
    "top_p": 0.9,
    "top_k": 5,
    "stream": True,
    "thinking": {"type": "enabled", "budget_tokens": 1024},
    "tools": [{"name": "f", "input_schema": {"type": "object"}}],
    "tool_choice": {"type": "auto"},
}
FULL_RESPONSES = {
    "model": "m",
    "instructions": "Be brief.",
    "input": [
        {"role": "user", "content": [{"type": "input_text", "text": "Hi"}]},
        {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c1", "output": "ok"},
    ],
    "tools": [{"type": "function", "name": "f", "parameters": {"type": "object"}}],
    "tool_choice": "auto",
    "parallel_tool_calls": True,
    "temperature": 0.5,
    "top_p": 0.9,
    "max_output_tokens": 64,
    **{"top_k": 5, "min_p": 0.1, "repetition_penalty": 1.1, "seed": 1, "ignore_eos": False},
    "stop": ["END"],
    "stop_token_ids": [2],
    "structured_outputs": {"regex": "[a-z]+"},
    "include": ["message.output_text.logprobs"],
    "top_logprobs": 2,
    "reasoning": {"effort": "low"},
    "text": {"format": {"type": "json_object"}},
    "stream": True,
}


@pytest.mark.parametrize(("api", "translate", "body"), [
    ("messages", messages.chat_request, FULL_MESSAGES),
    ("responses", responses.chat_request, FULL_RESPONSES),
])  # fmt: skip
def test_a_translation_reads_only_classified_fields_and_sends_only_bounded_chat_fields(api, translate, body):
    reading = Reading(body)
    chat = translate(reading)
    assert body.keys() <= reading.read  # each field of the body is one the translation reads
    assert reading.read - FIELDS[api].keys() == set()
    assert {name for name in reading.read if FIELDS[api][name] == NOT_TRANSLATED} == set()
    assert chat.keys() - FIELDS["chat_completions"].keys() == set()


def test_every_limit_is_documented_with_its_default():
    security = (ROOT / "docs" / "security.md").read_text()
    for name, field in RequestLimits.model_fields.items():
        default = field.default if isinstance(field.default, int) else "none"
        assert re.search(rf"^\| `{name}` \| {default}\b", security, re.M), name


ALLOWED = ("https://images.example.com", "http://10.0.0.5:8080")


@pytest.mark.parametrize("url", [
    "https://images.example.com/cat.png",
    "HTTPS://Images.Example.com:443/cat.png",
    "http://10.0.0.5:8080/a.jpg",
])  # fmt: skip
def test_a_url_of_an_allowed_origin_passes(url):
    assert url_problem(url, RequestLimits(allowed_media_urls=ALLOWED).allowed_media_urls) is None


@pytest.mark.parametrize("url", [
    "http://169.254.169.254/latest/meta-data/iam/security-credentials/",
    "https://images.example.com@169.254.169.254/",  # userinfo: the host is the address after @
    "https://169.254.169.254\\@images.example.com/",  # a backslash: WHATWG parsers end the host there
    "https://images.example.com.attacker.test/cat.png",
    "https://images.example.com:8443/cat.png",  # another port of an allowed host
    "http://10.0.0.5/a.jpg",  # the allowed origin names port 8080
    "http://images.example.com/cat.png",  # the allowed origin is https
    "https://%69mages.example.com/cat.png",  # percent-escapes in the host
    "https://images.example.com /cat.png",
    "file:///etc/passwd",
    "images.example.com/cat.png",
    "http://[::1]:8000/",
])  # fmt: skip
def test_a_url_of_any_other_origin_or_an_ambiguous_host_is_refused(url):
    assert url_problem(url, RequestLimits(allowed_media_urls=ALLOWED).allowed_media_urls) is not None


@pytest.mark.parametrize("entry", ["https://images.example.com/path", "images.example.com", "data:"])
def test_an_allowed_origin_must_be_scheme_and_host(entry):
    with pytest.raises(ValueError, match="allowed_media_urls"):
        RequestLimits(allowed_media_urls=(entry,))
