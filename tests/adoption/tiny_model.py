"""A weightless tiny model made offline: a GPT-2-shaped ``config.json`` and
a word-level tokenizer with a chat template.

vLLM's ``EngineArgs(model=DIR).create_engine_config()`` reads nothing else,
so vllm-omni's LLM path (model config, renderer, chat template) is built on
it; no weights are ever loaded (the engine is the fake one).
"""

from __future__ import annotations

import json
from pathlib import Path

WORDS = ("hello", "world", "say", "something", "stream", "please", "a", "the")
CHAT_TEMPLATE = (
    "{% for message in messages %}{{ message['content'] }} {% endfor %}"
    "{% if add_generation_prompt %}[BOS]{% endif %}"
)


def make(directory: Path) -> Path:
    """Write the model into ``directory`` and return it."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {
        word: index for index, word in enumerate(("[UNK]", "[BOS]", "[EOS]", *WORDS))
    }
    tokenizer = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    directory.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(directory / "tokenizer.json"))
    config = {
        "architectures": ["GPT2LMHeadModel"],
        "model_type": "gpt2",
        "vocab_size": len(vocab),
        "n_positions": 128,
        "n_embd": 32,
        "n_layer": 1,
        "n_head": 2,
        "bos_token_id": vocab["[BOS]"],
        "eos_token_id": vocab["[EOS]"],
        "torch_dtype": "float32",
    }
    (directory / "config.json").write_text(json.dumps(config))
    tokenizer_config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "unk_token": "[UNK]",
        "bos_token": "[BOS]",
        "eos_token": "[EOS]",
        "model_max_length": 128,
        "chat_template": CHAT_TEMPLATE,
    }
    (directory / "tokenizer_config.json").write_text(json.dumps(tokenizer_config))
    return directory
