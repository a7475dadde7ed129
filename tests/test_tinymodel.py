"""The tiny model: reproducible, loaded by transformers, with an append-only chat template for tools."""

import json
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer
from typer.testing import CliRunner

from otel_rl.cli import app
from otel_rl.tinymodel import CALC_TOOL, build_tokenizer, init_model

CALL = {
    "id": "call_1",
    "type": "function",
    "function": {"name": "calc", "arguments": '{"expression": "37+48"}'},
}
CHAT = [
    {"role": "system", "content": "You are a calculator agent."},
    {"role": "user", "content": "What is 37 + 48?"},
    {"role": "assistant", "content": None, "tool_calls": [CALL]},
    {"role": "tool", "tool_call_id": "call_1", "content": "85"},
    {"role": "assistant", "content": "The answer is 85."},
    {"role": "user", "content": 'And 2 * 3? Answer in JSON: {"answer": ...}'},
]


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir: Path):
    return AutoTokenizer.from_pretrained(tiny_model_dir)


def render(tokenizer, messages, **kwargs) -> str:
    return tokenizer.apply_chat_template(messages, tools=[CALC_TOOL], tokenize=False, **kwargs)


def test_model_init_command_is_deterministic_and_refuses_a_non_empty_folder(tiny_model_dir, tmp_path):
    runner = CliRunner(env={"COLUMNS": "400"})  # no line wrapping inside the error box
    result = runner.invoke(app, ["model", "init", str(tmp_path / "again"), "--seed", "0"])
    assert result.exit_code == 0, result.output
    names = sorted(p.name for p in tiny_model_dir.iterdir())
    assert names == sorted(p.name for p in (tmp_path / "again").iterdir())
    assert {"config.json", "generation_config.json", "model.safetensors", "tokenizer.json"} <= set(names)
    for name in names:
        assert (tmp_path / "again" / name).read_bytes() == (tiny_model_dir / name).read_bytes(), name

    refused = runner.invoke(app, ["model", "init", str(tmp_path / "again")])
    assert refused.exit_code != 0 and "not empty" in refused.output


def test_another_seed_changes_only_the_weights(tiny_model_dir, tmp_path):
    other = init_model(tmp_path / "seed1", seed=1)
    assert (other / "tokenizer.json").read_bytes() == (tiny_model_dir / "tokenizer.json").read_bytes()
    assert (other / "config.json").read_bytes() == (tiny_model_dir / "config.json").read_bytes()
    assert (other / "model.safetensors").read_bytes() != (tiny_model_dir / "model.safetensors").read_bytes()


def test_loaded_tokenizer_encodes_like_the_built_one_and_round_trips_any_text(tokenizer):
    built = build_tokenizer()
    texts = [
        "What is 37 + 48? The answer is 85.",
        '<tool_call>{"name": "calc", "arguments": {"expression": "(12-7)*3"}}</tool_call>',
        "tabs\tand  spaces\n\n\nnewlines, ünïcødé, 中文, emoji 🙂, control \x00\x07 bytes",
        "".join(chr(i) for i in range(1, 0x180)),  # ASCII, control characters, Latin-1, Latin Extended-A
    ]
    for text in texts:
        ids = tokenizer(text)["input_ids"]
        assert ids == built(text)["input_ids"]
        assert tokenizer.decode(ids) == text
    assert tokenizer.tokenize("12345") == ["1", "2", "3", "4", "5"]
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<tool_call>", "</tool_call>"]
    assert [len(tokenizer(s)["input_ids"]) for s in specials] == [1] * 5
    assert (tokenizer.eos_token, tokenizer.pad_token) == ("<|im_end|>", "<|endoftext|>")


def test_chat_template_renders_tool_definitions_tool_calls_and_tool_results(tokenizer):
    text = render(tokenizer, CHAT[:4], add_generation_prompt=True)
    assert text.startswith("<|im_start|>system\nYou are a calculator agent.\n\n# Tools\n")
    assert "<tools>\n" + json.dumps(CALC_TOOL) + "\n</tools>" in text
    assert text.endswith(
        "<|im_start|>user\nWhat is 37 + 48?<|im_end|>\n"
        '<|im_start|>assistant\n<tool_call>{"name": "calc", "arguments": {"expression": "37+48"}}'
        "</tool_call><|im_end|>\n"
        "<|im_start|>tool\n85<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    # vLLM hands the template parsed arguments; transformers-style flat calls render the same too.
    parsed = {"name": "calc", "arguments": {"expression": "37+48"}}
    for call in ({"type": "function", "function": parsed}, parsed):
        assert render(tokenizer, [*CHAT[:2], {"role": "assistant", "tool_calls": [call]}]) == render(
            tokenizer, CHAT[:3]
        )
    plain = tokenizer.apply_chat_template(CHAT[:2], tokenize=False)
    assert plain == (
        "<|im_start|>system\nYou are a calculator agent.<|im_end|>\n"
        "<|im_start|>user\nWhat is 37 + 48?<|im_end|>\n"
    )


def test_chat_template_is_append_only_in_text_and_token_ids(tokenizer):
    full = render(tokenizer, CHAT)
    full_ids = tokenizer(full)["input_ids"]
    for k in range(1, len(CHAT)):
        prefixes = [render(tokenizer, CHAT[:k])]
        if CHAT[k]["role"] == "assistant":
            prefixes.append(render(tokenizer, CHAT[:k], add_generation_prompt=True))
        for prefix in prefixes:
            assert full.startswith(prefix)
            ids = tokenizer(prefix)["input_ids"]
            assert full_ids[: len(ids)] == ids


def test_transformers_loads_the_float32_model_and_generates(tiny_model_dir, tokenizer):
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    assert model.dtype == torch.float32
    assert 0.9e6 < sum(p.numel() for p in model.parameters()) < 1.2e6
    assert model.config.vocab_size == len(tokenizer)
    prompt = tokenizer.apply_chat_template(CHAT[:2], add_generation_prompt=True, return_tensors="pt")
    output = model.generate(**prompt, max_new_tokens=8, min_new_tokens=8, do_sample=False)
    new_ids = output[0, prompt["input_ids"].shape[1] :].tolist()
    assert len(new_ids) == 8 and all(0 <= i < len(tokenizer) for i in new_ids)
