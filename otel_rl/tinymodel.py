"""A tiny Qwen2 model and byte-level BPE tokenizer, built seeded and offline, for vLLM and transformers."""

from __future__ import annotations

import json
import random
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

import typer

PAD = "<|endoftext|>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"  # end of every turn; the end-of-sequence token
TOOL_CALL_OPEN = "<tool_call>"
TOOL_CALL_CLOSE = "</tool_call>"
SPECIAL_TOKENS = (PAD, IM_START, IM_END)
# Not "special": they must stay in decoded text so that vLLM's hermes tool parser sees them.
TOOL_CALL_TOKENS = (TOOL_CALL_OPEN, TOOL_CALL_CLOSE)

# ChatML with Qwen-style tools: definitions in the system turn, calls as
# <tool_call>{"name": ..., "arguments": ...}</tool_call>. Append-only: each message renders the same whatever
# follows it (tool results are one turn each, no history rewriting), so a conversation's rendering extends the
# rendering of each of its prefixes, which is what exact-prefix merging of multi-turn calls relies on.
CHAT_TEMPLATE = (
    "{%- if tools %}"
    "{{- '<|im_start|>system\\n' }}"
    "{%- if messages and messages[0].role == 'system' %}{{- messages[0].content + '\\n\\n' }}{%- endif %}"
    "{{- '# Tools\\n\\nYou may call one or more functions. Their signatures are within <tools></tools>:\\n"
    "<tools>' }}"
    "{%- for tool in tools %}{{- '\\n' + (tool | tojson) }}{%- endfor %}"
    "{{- '\\n</tools>\\n\\nTo call a function, reply with '"
    ' + \'<tool_call>{"name": <function-name>, "arguments": <args-json-object>}</tool_call><|im_end|>\\n\' }}'
    "{%- endif %}"
    "{%- for message in messages %}"
    "{%- if message.role == 'system' and loop.first and tools %}{#- rendered above, with the tools #}"
    "{%- elif message.role == 'assistant' %}"
    "{{- '<|im_start|>assistant\\n' + (message.content or '') }}"
    "{%- for tool_call in message.tool_calls or [] %}"
    "{%- set call = tool_call.function if tool_call.function is defined else tool_call %}"
    "{{- '<tool_call>{\"name\": ' + (call.name | tojson) + ', \"arguments\": ' }}"
    "{%- if call.arguments is string %}{{- call.arguments }}"
    "{%- else %}{{- call.arguments | tojson }}{%- endif %}"
    "{{- '}</tool_call>' }}"
    "{%- endfor %}"
    "{{- '<|im_end|>\\n' }}"
    "{%- else %}"
    "{{- '<|im_start|>' + message.role + '\\n' + (message.content or '') + '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)

CALC_TOOL = {
    "type": "function",
    "function": {
        "name": "calc",
        "description": "Evaluate an arithmetic expression and return the result.",
        "parameters": {
            "type": "object",
            "properties": {"expression": {"type": "string", "description": "for example 37+48"}},
            "required": ["expression"],
        },
    },
}
_QUESTIONS = (
    "What is {a} {op} {b}?",
    "Compute {a} {op} {b}.",
    "Calculate {a} {op} {b}, please.",
    "How much is {a} {op} {b}?",
    "Work out {a} {op} {b} for me.",
)
_GENERIC = (
    "You are a helpful assistant. Use the tools when they help.",
    "Hello! How can I help you today?",
    "The quick brown fox jumps over the lazy dog.",
    "I could not parse that. Please try again with a valid request.",
    "Sure, here is a short summary of the results in JSON: [1, 2.5, true, null].",
    "error: division by zero is not allowed",
    "Thanks, that is all for now. Have a good day!",
)
# The tokenizer does not depend on the model seed or shape, so checkpoints of any seed share one vocabulary.
TOKENIZER_CORPUS_SEED = 1234
VOCAB_TARGET = 512  # ≈300 merges: the calculator task's words, numbers and JSON punctuation
MAX_POSITIONS = 1 << 20  # rotary positions cost nothing to declare; vLLM's KV cache bounds what is served
_SPECIAL_SPLIT = re.compile("|".join(re.escape(t) for t in SPECIAL_TOKENS + TOOL_CALL_TOKENS))


@dataclass(frozen=True)
class TinyModelShape:
    """Qwen2 dimensions; the defaults suit vLLM's CPU attention (head_dim 64) and train fast on 2 cores."""

    hidden: int = 128
    layers: int = 4
    heads: int = 2
    kv_heads: int = 1
    head_dim: int = 64
    mlp: int = 512
    max_positions: int = 1024


def calculator_chats(rng: random.Random, n: int) -> Iterator[list[dict[str, Any]]]:
    """Synthetic calculator-agent conversations: question, tool call, tool result, final answer."""
    ops = {"+": lambda a, b: a + b, "-": lambda a, b: a - b, "*": lambda a, b: a * b}
    for _ in range(n):
        a, b, op = rng.randint(10, 99), rng.randint(10, 99), rng.choice(list(ops))
        expression = f"{a}{op}{b}"
        result = str(ops[op](a, b)) if rng.random() > 0.05 else "error: invalid expression"
        yield [
            {"role": "system", "content": rng.choice(_GENERIC)},
            {"role": "user", "content": rng.choice(_QUESTIONS).format(a=a, op=op, b=b)},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [{"name": "calc", "arguments": {"expression": expression}}],
            },
            {"role": "tool", "content": result},
            {"role": "assistant", "content": f"The answer is {result}."},
        ]


def _training_pieces(n_chats: int, corpus: Sequence[str] = ()) -> Iterator[str]:
    """Rendered chats (and `corpus`) split around the added tokens, which BPE must not learn merges for."""
    from transformers.utils.chat_template_utils import render_jinja_template

    rng = random.Random(TOKENIZER_CORPUS_SEED)
    chats = list(calculator_chats(rng, n_chats))
    rendered, _ = render_jinja_template(chats, tools=[CALC_TOOL], chat_template=CHAT_TEMPLATE)
    for text in [*rendered, *_GENERIC, *corpus]:
        yield from (piece for piece in _SPECIAL_SPLIT.split(text) if piece)


def build_tokenizer(corpus: Sequence[str] = (), vocab_size: int = VOCAB_TARGET) -> Any:
    """Train the byte-level BPE (digits one by one) and wrap it, with the chat template, as a Qwen2Tokenizer.
    `corpus`: more text to learn merges from (another task's rendered chats: its words become few tokens).

    transformers loads any tokenizer saved next to a qwen2 config as `Qwen2Tokenizer`, which rebuilds the
    normalizer and pre-tokenizer itself; training with exactly those keeps the saved and loaded ids equal.
    """
    from tokenizers import AddedToken, Tokenizer, models, pre_tokenizers, trainers
    from transformers import Qwen2Tokenizer

    qwen_backend = Qwen2Tokenizer().backend_tokenizer
    backend = Tokenizer(models.BPE())
    backend.normalizer = qwen_backend.normalizer
    backend.pre_tokenizer = qwen_backend.pre_tokenizer
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    backend.train_from_iterator(_training_pieces(n_chats=1000, corpus=corpus), trainer=trainer)
    trained = json.loads(backend.to_str())["model"]
    tokenizer = Qwen2Tokenizer(
        vocab=trained["vocab"],
        merges=[tuple(merge) for merge in trained["merges"]],
        unk_token=None,
        eos_token=IM_END,
        pad_token=PAD,
    )
    tokenizer.add_tokens([AddedToken(IM_START, special=True, normalized=False)], special_tokens=True)
    tokenizer.add_tokens([AddedToken(t, special=False, normalized=False) for t in TOOL_CALL_TOKENS])
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


def init_model(
    directory: str | Path,
    *,
    seed: int = 0,
    shape: TinyModelShape = TinyModelShape(),
    corpus: Sequence[str] = (),
    vocab_size: int = VOCAB_TARGET,
) -> Path:
    """Write tokenizer, config, generation config and seeded float32 safetensors weights into `directory`
    (`corpus`, `vocab_size`: see build_tokenizer)."""
    import torch
    from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM

    directory = Path(directory)
    if directory.exists() and any(directory.iterdir()):
        raise FileExistsError(f"{directory} is not empty; choose a new folder for the model")
    tokenizer = build_tokenizer(corpus, vocab_size)
    tokenizer.model_max_length = shape.max_positions
    pad_id, eos_id = tokenizer.convert_tokens_to_ids([PAD, IM_END])
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=shape.hidden,
        intermediate_size=shape.mlp,
        num_hidden_layers=shape.layers,
        num_attention_heads=shape.heads,
        num_key_value_heads=shape.kv_heads,
        head_dim=shape.head_dim,
        max_position_embeddings=shape.max_positions,
        # Untied: vLLM 0.32's in-place reload_weights leaves a tied lm_head with the old weights.
        tie_word_embeddings=False,
        bos_token_id=None,
        eos_token_id=eos_id,
        pad_token_id=pad_id,
        dtype="float32",
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Qwen2ForCausalLM(config)
    model.generation_config = GenerationConfig(eos_token_id=[eos_id, pad_id], pad_token_id=pad_id)
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory


model_app = typer.Typer(help="Build the tiny local model.", no_args_is_help=True)


@model_app.command("init")
def init_command(
    directory: Annotated[Path, typer.Argument(help="New folder to write the model into.")],
    seed: Annotated[int, typer.Option(help="Seed of the weight initialisation.")] = 0,
    hidden: Annotated[int, typer.Option(help="Hidden size.")] = TinyModelShape.hidden,
    layers: Annotated[int, typer.Option(help="Number of decoder layers.")] = TinyModelShape.layers,
    heads: Annotated[int, typer.Option(help="Attention heads.")] = TinyModelShape.heads,
    kv_heads: Annotated[int, typer.Option(help="Key/value heads.")] = TinyModelShape.kv_heads,
    head_dim: Annotated[
        int, typer.Option(help="Size of each head (vLLM's CPU attention: 64+).")
    ] = TinyModelShape.head_dim,
    mlp: Annotated[int, typer.Option(help="MLP intermediate size.")] = TinyModelShape.mlp,
    max_positions: Annotated[
        int,
        typer.Option(
            min=16,
            max=MAX_POSITIONS,
            help="Context the model declares, in tokens (rotary: no weights depend on it). A coding CLI's "
            "first prompt needs ~34K: give 65536.",
        ),
    ] = TinyModelShape.max_positions,
) -> None:
    """Build a seeded tokenizer and Qwen2 model into DIRECTORY (offline, a few seconds)."""
    from transformers.utils import logging

    logging.disable_progress_bar()  # saving one small file needs no progress bar
    shape = TinyModelShape(
        hidden=hidden,
        layers=layers,
        heads=heads,
        kv_heads=kv_heads,
        head_dim=head_dim,
        mlp=mlp,
        max_positions=max_positions,
    )
    try:
        path = init_model(directory, seed=seed, shape=shape)
    except FileExistsError as error:
        raise typer.BadParameter(str(error), param_hint="DIRECTORY") from error
    typer.echo(f"wrote a tiny Qwen2 model (seed {seed}) to {path}")
