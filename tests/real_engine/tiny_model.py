"""A tiny random-weight Qwen2 model and its tokenizer, built locally, never downloaded.

Owns the one model the real-engine tests and benchmark run: a Qwen2 config
(hidden 128, 2 layers, 4 heads, 2 KV heads: head size 32, since vLLM's CPU
attention rejects 16), seeded random weights, and a byte-level BPE tokenizer
trained with ``tokenizers`` on generated text, with a chat template. The
build is deterministic and takes a few seconds; the result is cached in a
directory keyed by ``VERSION`` and reused by every later run.

Run it to build (or find) the model and print its path::

    python -m tests.real_engine.tiny_model [CACHE_DIR]
"""

from __future__ import annotations

import os
import random
import shutil
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

__all__ = [
    "LONG_MODEL_LEN",
    "LORA_RANK",
    "MAX_MODEL_LEN",
    "VERSION",
    "build_tiny_lora",
    "build_tiny_model",
    "default_cache_dir",
]

# Bump when the recipe changes: the cache directory is keyed by it.
# How the real engine runs here: one thread, 1 GiB of KV cache, no CPU
# pinning (the machine is shared), and never the network (the model is built
# locally). Set, unless already set, before vLLM is imported.
ENGINE_ENVIRONMENT = {
    "OMP_NUM_THREADS": "1",
    "VLLM_CPU_KVCACHE_SPACE": "1",
    "VLLM_CPU_OMP_THREADS_BIND": "nobind",
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
}


def use_engine_environment() -> None:
    """``ENGINE_ENVIRONMENT`` where the caller's environment is silent."""
    for name, value in ENGINE_ENVIRONMENT.items():
        os.environ.setdefault(name, value)


VERSION = "3"
SEED = 0
MAX_MODEL_LEN = 128
# What the model's positions allow: drills that need a generation longer than
# a client's reaction time serve it with this max_model_len (the pipeline's
# own is MAX_MODEL_LEN).
LONG_MODEL_LEN = 32768
LORA_RANK = 8
VOCAB_SIZE = 512
_WORDS = (
    "omni stage audio image video token model engine request stream error "
    "client server prompt reply hello world answer question fast slow small "
    "large red green blue one two three four five six seven eight nine ten"
).split()
_CHAT_TEMPLATE = (
    "{% for message in messages %}<|{{ message['role'] }}|>{{ message['content'] }}"
    "<|end|>{% endfor %}{% if add_generation_prompt %}<|assistant|>{% endif %}"
)
_SPECIALS = ["<|endoftext|>", "<|end|>", "<|user|>", "<|assistant|>", "<|system|>"]


def default_cache_dir() -> Path:
    """``$VLLM_OMNI_TEST_CACHE`` or ``~/.cache/vllm-omni-tests``."""
    root = os.environ.get("VLLM_OMNI_TEST_CACHE")
    return Path(root) if root else Path.home() / ".cache" / "vllm-omni-tests"


def _corpus(rng: random.Random, lines: int = 2000) -> list[str]:
    return [
        " ".join(rng.choice(_WORDS) for _ in range(rng.randint(3, 16)))
        for _ in range(lines)
    ]


def _build(target: Path) -> None:
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

    rng = random.Random(SEED)
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=_SPECIALS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(_corpus(rng), trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        eos_token="<|endoftext|>",
        pad_token="<|endoftext|>",
        model_max_length=MAX_MODEL_LEN,
    )
    fast.chat_template = _CHAT_TEMPLATE
    fast.save_pretrained(target)

    torch.manual_seed(SEED)
    config = Qwen2Config(
        vocab_size=len(fast),
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        max_position_embeddings=LONG_MODEL_LEN,
        eos_token_id=fast.eos_token_id,
        bos_token_id=fast.eos_token_id,
        tie_word_embeddings=True,
        torch_dtype="float32",
    )
    Qwen2ForCausalLM(config).save_pretrained(target, safe_serialization=True)


def _build_lora(target: Path) -> None:
    """A PEFT LoRA adapter (rank 8, q_proj and v_proj) for the tiny model."""
    import json

    import torch
    from safetensors.torch import save_file

    torch.manual_seed(SEED + 1)
    outputs = {"q_proj": 4 * 32, "v_proj": 2 * 32}
    tensors = {}
    for layer in range(2):
        for module, out in outputs.items():
            prefix = f"base_model.model.model.layers.{layer}.self_attn.{module}"
            tensors[f"{prefix}.lora_A.weight"] = torch.randn(LORA_RANK, 128) * 0.02
            tensors[f"{prefix}.lora_B.weight"] = torch.randn(out, LORA_RANK) * 0.02
    target.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(target / "adapter_model.safetensors"))
    config = {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "r": LORA_RANK,
        "lora_alpha": 16,
        "lora_dropout": 0.0,
        "bias": "none",
        "target_modules": sorted(outputs),
        "base_model_name_or_path": "tiny-qwen2",
        "fan_in_fan_out": False,
    }
    (target / "adapter_config.json").write_text(json.dumps(config, indent=2))


def build_tiny_model(cache_dir: Path | None = None) -> Path:
    """The model directory, built once into ``cache_dir`` (atomic rename)."""
    return _cached(cache_dir, f"tiny-qwen2-v{VERSION}", "config.json", _build)


def build_tiny_lora(cache_dir: Path | None = None) -> Path:
    """A LoRA adapter directory for the tiny model, built once like it."""
    return _cached(
        cache_dir, f"tiny-qwen2-lora-v{VERSION}", "adapter_config.json", _build_lora
    )


def _cached(
    cache_dir: Path | None, name: str, marker: str, build: Callable[[Path], None]
) -> Path:
    root = cache_dir or default_cache_dir()
    target = root / name
    if (target / marker).is_file():
        return target
    root.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".tiny-qwen2-", dir=root))
    try:
        build(staging)
        try:
            staging.rename(target)
        except OSError:
            # Another process built it first: keep theirs.
            if not (target / marker).is_file():
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target


if __name__ == "__main__":
    cache = Path(sys.argv[1]) if len(sys.argv) > 1 else None
    print(build_tiny_model(cache))
    print(build_tiny_lora(cache))
