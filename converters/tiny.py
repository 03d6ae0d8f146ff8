"""Tiny random checkpoints in the real Hugging Face layouts, for the demo and the tests.

Each is written by the reference implementation itself (`save_pretrained` of the transformers
class), so the files have the real parameter names and config keys that a downloaded checkpoint
has. Weights are random (seeded): the models load and run like the real ones but say nothing.
"""
from __future__ import annotations

import hashlib
import inspect
import json
import shutil
import sys
from pathlib import Path

import torch

VERSION = "1"        # bump when a checkpoint's content changes, so old folders are rebuilt

CHATML_TEMPLATE = (
    "{%- for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor -%}"
    "{%- if add_generation_prompt %}<|im_start|>assistant\n{% endif -%}"
)

CORPUS = [
    "Triton serves models with dynamic batching and streaming responses.",
    "The quick brown fox jumps over the lazy dog; pack my box with five dozen liquor jugs.",
    "Write a haiku about the sea. Tell me a story about a robot who learns to paint.",
    "Numbers 0123456789 and punctuation: (a, b) [c] {d} <e> 'f' \"g\" - _ + = * / \\ | ! ? @ # $ % ^ &",
    "Unicode: café naïve résumé, 中文字符测试, 日本語のテキスト, 한국어, Ελληνικά, emoji 🙂🚀🎉.",
    "def main():\n    print('hello world')\n    return 0\n",
]


def build_tokenizer(out: Path):
    """A byte-level BPE (Qwen-style special tokens, ChatML template) trained on a small corpus."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=512, special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(CORPUS * 4, trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                                   additional_special_tokens=["<|im_start|>"])
    fast.chat_template = CHATML_TEMPLATE
    fast.save_pretrained(str(out))
    return fast


def _randomize(model: torch.nn.Module, seed: int, std: float) -> None:
    """Weights large enough that greedy decoding wanders instead of repeating one token."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=g))
            else:
                p.copy_(std * torch.randn(p.shape, generator=g))


def qwen3(out: Path, tokenizer) -> None:
    from transformers import Qwen3Config, Qwen3ForCausalLM

    config = Qwen3Config(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=4096,
                         tie_word_embeddings=True, rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
                         eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
    model = Qwen3ForCausalLM(config)
    _randomize(model, seed=3, std=0.25)
    model.save_pretrained(str(out))


def qwen3_5(out: Path, tokenizer) -> None:
    from transformers import Qwen3_5ForCausalLM, Qwen3_5TextConfig

    config = Qwen3_5TextConfig(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=4,
                               num_attention_heads=4, num_key_value_heads=2, head_dim=32,
                               linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=16,
                               linear_value_head_dim=16, linear_conv_kernel_dim=4, max_position_embeddings=4096,
                               tie_word_embeddings=True,
                               rope_parameters={"rope_type": "default", "rope_theta": 10000000.0,
                                                "partial_rotary_factor": 0.25},
                               eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
    model = Qwen3_5ForCausalLM(config)
    _randomize(model, seed=35, std=0.25)
    model.save_pretrained(str(out))


def _chat_builder(make):
    """A chat checkpoint: the tiny tokenizer, the model, an EOS-aware generation config."""
    def build(out: Path) -> None:
        tokenizer = build_tokenizer(out)
        make(out, tokenizer)
        gen = {"eos_token_id": [tokenizer.eos_token_id, tokenizer.pad_token_id]}
        (out / "generation_config.json").write_text(json.dumps(gen, indent=2))
    return build


def builders() -> dict:
    from triton_omni.converters.tiny_bagel import BUILDERS as BAGEL
    from triton_omni.converters.tiny_chatterbox import BUILDERS as CHATTERBOX
    from triton_omni.converters.tiny_fish import BUILDERS as FISH
    from triton_omni.converters.tiny_image import BUILDERS as IMAGE
    from triton_omni.converters.tiny_joyimage import BUILDERS as JOYIMAGE
    from triton_omni.converters.tiny_omnivoice import BUILDERS as OMNIVOICE
    from converters.tiny_qwen3_tts import BUILDERS as QWEN3_TTS
    from triton_omni.converters.tiny_tts import BUILDERS as TTS

    return {"qwen3": _chat_builder(qwen3), "qwen3_5": _chat_builder(qwen3_5), **TTS, **QWEN3_TTS, **IMAGE, **JOYIMAGE,
            **OMNIVOICE, **CHATTERBOX, **FISH, **BAGEL}


def _stamp(builder) -> str:
    """Changes whenever the module that defines the builder changes: its checkpoints are rebuilt."""
    source = inspect.getsource(sys.modules[builder.__module__])
    return VERSION + "-" + hashlib.sha1(source.encode()).hexdigest()[:12]


def build(root: str | Path, names: list[str] | None = None) -> dict[str, Path]:
    """Build (or reuse) tiny checkpoints under root/<name>; returns name -> folder."""
    root = Path(root)
    table = builders()
    done = {}
    for name in names or list(table):
        out = root / name
        stamp = out / ".tiny-version"
        if not (stamp.exists() and stamp.read_text() == _stamp(table[name])):
            shutil.rmtree(out, ignore_errors=True)
            out.mkdir(parents=True)
            table[name](out)
            stamp.write_text(_stamp(table[name]))
        done[name] = out
    return done


def synthetic_tokenizer(out: Path, vocab_size: int, specials: dict[str, int]):
    """A byte-level tokenizer of any vocabulary size, for benchmarks of real-size shapes: ids 0-255
    are the bytes (no merges, so every byte of a prompt is one token), named special tokens sit at
    the ids given, every other id is a filler piece of letters."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    alphabet = pre_tokenizers.ByteLevel.alphabet()
    byte_chars = sorted(alphabet, key=lambda c: _byte_alphabet_index(c))
    vocab = {c: i for i, c in enumerate(byte_chars)}
    vocab.update(specials)
    taken = set(specials.values())
    for i in range(len(byte_chars), vocab_size):
        if i not in taken:
            vocab[f"t{i:x}"] = i
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    from tokenizers import AddedToken

    for name, tid in sorted(specials.items(), key=lambda kv: kv[1]):
        tok.add_special_tokens([AddedToken(name, special=True)])
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>")
    fast.chat_template = CHATML_TEMPLATE
    fast.save_pretrained(str(out))
    return fast


def _byte_alphabet_index(char: str) -> int:
    from triton_omni.text.tokenizer import _byte_alphabet

    return _byte_alphabet()[char]
