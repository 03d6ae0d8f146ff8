"""What the tiny-checkpoint builders (converters/tiny_*.py) share: the corpus their tokenizers train
on, the ChatML BPE tokenizer, seeded weights. converters/tiny.py (the entry point) imports the
builders; the builders import only this module, never tiny.py or each other.
"""
from __future__ import annotations

import json
from pathlib import Path

import torch

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


def train_bpe(corpus: list[str], additional_special_tokens: list[str]):
    """A byte-level BPE (Qwen-style special tokens) trained on `corpus`, as a fast tokenizer (not saved)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=512, special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(corpus, trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                                   additional_special_tokens=additional_special_tokens)


# A Qwen-style chat template: ChatML turns, tools in the system turn, tool calls and results in the
# history, and `enable_thinking` opening the answer's reasoning as Qwen3.5's template does (left out,
# the tiny checkpoints answer without reasoning, so plain chat keeps its ChatML prompt).
QWEN_TEMPLATE = (
    "{%- if tools %}<|im_start|>system\n{% if messages[0].role == 'system' %}{{ messages[0].content }}\n\n{% endif %}"
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>"
    "{%- for tool in tools %}\n{{ tool | tojson }}{%- endfor %}\n</tools>\n\n"
    "For each function call, return a json object with function name and arguments within <tool_call></tool_call> "
    "XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n"
    "{%- elif messages[0].role == 'system' %}<|im_start|>system\n{{ messages[0].content }}<|im_end|>\n{% endif %}"
    "{%- for m in messages %}"
    "{%- if m.role == 'system' and loop.first %}"
    "{%- elif m.role == 'assistant' %}<|im_start|>assistant\n"
    "{%- if m.reasoning_content %}<think>\n{{ m.reasoning_content }}\n</think>\n\n{% endif %}{{ m.content }}"
    "{%- for tc in m.tool_calls or [] %}\n<tool_call>\n{\"name\": \"{{ tc.function.name }}\", \"arguments\": "
    "{{ tc.function.arguments | tojson }}}\n</tool_call>{%- endfor %}<|im_end|>\n"
    "{%- elif m.role == 'tool' %}<|im_start|>user\n<tool_response>\n{{ m.content }}\n</tool_response><|im_end|>\n"
    "{%- else %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}<|im_start|>assistant\n{% if enable_thinking is defined and enable_thinking %}"
    "<think>\n{% endif %}{% endif %}"
)
# Qwen's reasoning and tool-call markers: added tokens of their own, not special (they decode as text)
CHAT_MARKERS = ["<think>", "</think>", "<tool_call>", "</tool_call>"]


def build_tokenizer(out: Path, chat_markers: bool = False):
    """The chat models' tokenizer: the BPE trained on the corpus, with the ChatML template, or with
    `chat_markers` Qwen's markers as added tokens and the Qwen-style template above."""
    from tokenizers import AddedToken

    fast = train_bpe(CORPUS * 4, ["<|im_start|>"])
    fast.chat_template = CHATML_TEMPLATE
    if chat_markers:
        fast.add_tokens([AddedToken(m, special=False, normalized=False) for m in CHAT_MARKERS])
        fast.chat_template = QWEN_TEMPLATE
    fast.save_pretrained(str(out))
    return fast


def chat_builder(make):
    """A chat checkpoint's builder: the tiny tokenizer (with Qwen's markers), the model `make(out,
    tokenizer)` writes, an EOS-aware generation config."""
    def build(out: Path) -> None:
        tokenizer = build_tokenizer(out, chat_markers=True)
        make(out, tokenizer)
        gen = {"eos_token_id": [tokenizer.eos_token_id, tokenizer.pad_token_id]}
        (out / "generation_config.json").write_text(json.dumps(gen, indent=2))
    return build


def quiet_markers(model, tokenizer) -> None:
    """Near-zero embeddings (and so, tied, logits) for the reasoning / tool-call markers: random
    weights then never open or close reasoning or a tool call by themselves (plain chat stays plain
    content); a request's reasoning budget or a tool-call grammar still produces them."""
    ids = [tokenizer.convert_tokens_to_ids(m) for m in CHAT_MARKERS]
    with torch.no_grad():
        model.get_input_embeddings().weight[ids] *= 0.01


def randomize(model: torch.nn.Module, seed: int, std: float = 0.25) -> torch.nn.Module:
    """Seeded weights, norms near 1 and the rest large enough that greedy decoding wanders instead of
    repeating one token, and that different prompts give visibly different hidden states (default
    initialisation leaves them nearly the same)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=g))
            else:
                p.copy_(std * torch.randn(p.shape, generator=g))
    return model


def seeded(seed: int, make):
    """Build a model under a fixed seed, so its default initialisation is reproducible."""
    torch.manual_seed(seed)
    return make()


# Qwen-Image-Edit's system prompt (the pipeline's template), in the tokenizer's corpus so it takes
# whole-word pieces rather than single bytes.
QWEN_EDIT_SYSTEM = ("Describe the key features of the input image (color, shape, size, texture, objects, background), "
                    "then explain how the user's text instruction should alter or modify the image. Generate a new "
                    "image that meets the user's requirements while maintaining consistency with the original input "
                    "where appropriate.")
QWEN_VL_SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|vision_start|>", "<|vision_end|>",
                   "<|image_pad|>", "<|video_pad|>"]


def qwen2_tokenizer(system_prompt: str = QWEN_EDIT_SYSTEM):
    """A `Qwen2Tokenizer` (the Qwen-VL releases' class: Qwen's pre-tokenizer regex, byte-level BPE) with a
    tiny vocabulary trained on the corpus and a pipeline's system prompt, and the vision special tokens
    the processor and the text encoder look up."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import Qwen2Tokenizer

    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(vocab_size=512, special_tokens=QWEN_VL_SPECIAL, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    bpe.train_from_iterator((CORPUS + [system_prompt]) * 4, trainer)
    trained = json.loads(bpe.to_str())["model"]
    tokenizer = Qwen2Tokenizer(vocab=trained["vocab"], merges=[tuple(m) for m in trained["merges"]],
                               eos_token="<|im_end|>", pad_token="<|endoftext|>")
    tokenizer.add_special_tokens({"additional_special_tokens": QWEN_VL_SPECIAL[1:]})
    return tokenizer


def synthetic_tokenizer(out: Path, vocab_size: int, specials: dict[str, int]):
    """A byte-level tokenizer of any vocabulary size, for benchmarks of real-size shapes: ids 0-255
    are the bytes (no merges, so every byte of a prompt is one token), named special tokens sit at
    the ids given, every other id is a filler piece of letters."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    alphabet = pre_tokenizers.ByteLevel.alphabet()
    byte_chars = sorted(alphabet, key=byte_alphabet_index)
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


def byte_alphabet_index(char: str) -> int:
    from triton_omni.text.tokenizer import _byte_alphabet

    return _byte_alphabet()[char]
