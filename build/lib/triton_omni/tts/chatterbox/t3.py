"""Chatterbox TTS (Resemble AI, the `chatterbox-tts` package 0.1.7, English model): text -> T3 speech tokens
-> S3Gen (python_backends/tts/chatterbox/s3gen.py) -> 24 kHz waveform.

The checkpoint folder is the release's (ResembleAI/chatterbox): t3_cfg.safetensors, s3gen.safetensors,
ve.safetensors, tokenizer.json, conds.pt (the built-in voice). The release has no config file: its sizes
are fixed in the package's code. An optional config.json here overrides them (the tiny test checkpoint
has one); `t3.llama` is the Llama config dict the package keeps in LLAMA_CONFIGS, `t3.perceiver` the
Perceiver's arguments.

T3, as ChatterboxTTS.generate runs it:
- the prompt is [speaker (1 position), the voice's prompt speech tokens (150 for the built-in voice, at most
  150 for a cloned one: python_backends/tts/chatterbox/voice.py) resampled to 32 by a perceiver,
  exaggeration (1)] + [start-of-text, text tokens, end-of-text] + [start-of-speech] twice (once
  from the prompt's speech part, once as the first decode input); text and speech tokens carry learned
  position embeddings of their own. The Llama backbone itself is transformers' LlamaModel.
- classifier-free guidance: a second row with the text embeddings zeroed (their position embeddings
  kept); logits = cond + cfg_weight * (cond - uncond).
- sampling: repetition penalty over the generated ids (start token included), temperature, min-p, top-p,
  then one multinomial draw; stop at the stop-speech token. Here temperature 0 means the best token
  (the package always samples; it equals the package run with min_p = 1).

Why T3 does not run on the project's AR engine: every request is a pair of rows (cond / uncond) whose
logits are mixed before a token is drawn, and that token is fed to both rows. The engine samples each
sequence on its own, and the speech-position embeddings are not a token embedding the engine can look up,
so T3 runs here in a plain batched loop with transformers' KV cache.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

# token ids fixed by the package (T3Config)
START_TEXT, STOP_TEXT = 255, 0
START_SPEECH, STOP_SPEECH = 6561, 6562
SPEECH_VOCAB = 6561                    # ids past this are control tokens, dropped before S3Gen
SPACE = "[SPACE]"

# the release's T3 sizes (T3Config.english_only, LLAMA_CONFIGS["Llama_520M"], Perceiver defaults)
RELEASE_LLAMA = dict(
    vocab_size=8, max_position_embeddings=131072, hidden_size=1024, intermediate_size=4096,
    num_hidden_layers=30, num_attention_heads=16, head_dim=64, tie_word_embeddings=False, hidden_act="silu",
    attention_bias=False, attention_dropout=0.0, mlp_bias=False, num_key_value_heads=16, rms_norm_eps=1e-05,
    rope_scaling=dict(factor=8.0, high_freq_factor=4.0, low_freq_factor=1.0, original_max_position_embeddings=8192,
                      rope_type="llama3"),
    rope_theta=500000.0)
RELEASE_PERCEIVER = dict(pre_attention_query_token=32, pre_attention_query_size=1024, embedding_dim=1024,
                         num_attn_heads=4)
T3_SIZES = dict(text_vocab=704, speech_vocab=8194, max_text_tokens=2048, max_speech_tokens=4096,
                speaker_embed_size=256)


def read_config(folder: Path) -> dict:
    """The optional size overrides (config.json); {} for a release folder."""
    path = Path(folder) / "config.json"
    return json.loads(path.read_text()) if path.exists() else {}


# -- text -----------------------------------------------------------------------------------------------

_PUNCTUATION = [("...", ", "), ("…", ", "), (":", ","), (" - ", ", "), (";", ", "), ("—", "-"), ("–", "-"),
                (" ,", ","), ("“", '"'), ("”", '"'), ("‘", "'"), ("’", "'")]


def normalize_text(text: str) -> str:
    """The package's punc_norm: capitalised, single spaces, uncommon punctuation replaced by what the model
    saw in training, and a full stop when the text does not end a sentence."""
    if not text:
        return text
    if text[0].islower():
        text = text[0].upper() + text[1:]
    text = " ".join(text.split())
    for old, new in _PUNCTUATION:
        text = text.replace(old, new)
    text = text.rstrip(" ")
    if not text.endswith((".", "!", "?", "-", ",")):
        text += "."
    return text


class TextTokenizer:
    """tokenizer.json as the package's EnTokenizer uses it: spaces become the [SPACE] token."""

    def __init__(self, path: str | Path):
        from tokenizers import Tokenizer

        self.tokenizer = Tokenizer.from_file(str(path))
        vocab = self.tokenizer.get_vocab()
        if "[START]" not in vocab or "[STOP]" not in vocab:
            raise ValueError(f"{path}: not a Chatterbox text tokenizer (no [START]/[STOP] tokens)")

    def ids(self, text: str) -> list[int]:
        """[start, tokens of the normalised text, stop]: T3's text input."""
        return [START_TEXT, *self.tokenizer.encode(normalize_text(text).replace(" ", SPACE)).ids, STOP_TEXT]


# -- T3 -------------------------------------------------------------------------------------------------

class _CrossAttention(nn.Module):
    """The perceiver's attention block (one LayerNorm for queries and keys, residual on the queries)."""

    def __init__(self, dim: int, heads: int):
        super().__init__()
        self.heads = heads
        self.norm = nn.LayerNorm(dim)
        self.to_q, self.to_k, self.to_v, self.proj_out = (nn.Linear(dim, dim) for _ in range(4))

    def forward(self, x: torch.Tensor, context: torch.Tensor) -> torch.Tensor:
        b, n, d = x.shape
        q = self.to_q(self.norm(x))
        c = self.norm(context)
        k, v = self.to_k(c), self.to_v(c)
        split = lambda t: t.view(b, t.shape[1], self.heads, d // self.heads).transpose(1, 2)  # noqa: E731
        out = F.scaled_dot_product_attention(split(q), split(k), split(v))
        return x + self.proj_out(out.transpose(1, 2).reshape(b, n, d))


class Perceiver(nn.Module):
    """Resamples the prompt speech embeddings to a fixed number of learned queries (cross attention, then
    self attention with the same block)."""

    def __init__(self, pre_attention_query_token: int, pre_attention_query_size: int, embedding_dim: int,
                 num_attn_heads: int):
        super().__init__()
        self.pre_attention_query = nn.Parameter(torch.zeros(1, pre_attention_query_token, pre_attention_query_size))
        self.attn = _CrossAttention(embedding_dim, num_attn_heads)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        queries = self.attn(self.pre_attention_query.expand(h.shape[0], -1, -1), h)
        return self.attn(queries, queries)


class CondEncoder(nn.Module):
    def __init__(self, dim: int, speaker_embed_size: int, perceiver: dict):
        super().__init__()
        self.spkr_enc = nn.Linear(speaker_embed_size, dim)
        self.emotion_adv_fc = nn.Linear(1, dim, bias=False)
        self.perceiver = Perceiver(**perceiver)


class Positions(nn.Module):
    """A learned position table (parameter name `emb`, as the package's LearnedPositionEmbeddings)."""

    def __init__(self, length: int, dim: int):
        super().__init__()
        self.emb = nn.Embedding(length, dim)

    def forward(self, start: int, n: int) -> torch.Tensor:
        return self.emb.weight[start:start + n]


@dataclass
class Voice:
    """T3's share of a voice (conds.pt's `t3`): speaker embedding [1, 256], prompt speech tokens [1, P]."""
    speaker: torch.Tensor
    prompt_tokens: torch.Tensor


@dataclass
class Sampling:
    """ChatterboxTTS.generate's defaults."""
    temperature: float = 0.8
    top_p: float = 1.0
    min_p: float = 0.05
    repetition_penalty: float = 1.2
    cfg_weight: float = 0.5
    exaggeration: float = 0.5


@dataclass
class T3Job:
    text_ids: list[int]                # with start / stop text tokens
    sampling: Sampling
    seed: int
    max_new_tokens: int = 1000
    voice: Voice | None = None         # this request's voice (cloned or built-in); None: generate_tokens' voice


class T3(nn.Module):
    def __init__(self, config: dict | None = None):
        super().__init__()
        from transformers import LlamaConfig, LlamaModel

        config = config or {}
        llama = {k: v for k, v in config.get("llama", RELEASE_LLAMA).items() if k not in ("model_type", "torch_dtype")}
        self.cfg = LlamaConfig(**{**llama, "attn_implementation": "sdpa"})
        self.tfmr = LlamaModel(self.cfg)
        dim, s = self.cfg.hidden_size, T3_SIZES
        self.cond_enc = CondEncoder(dim, s["speaker_embed_size"], config.get("perceiver", RELEASE_PERCEIVER))
        self.text_emb = nn.Embedding(s["text_vocab"], dim)
        self.speech_emb = nn.Embedding(s["speech_vocab"], dim)
        self.text_pos_emb = Positions(s["max_text_tokens"] + 2, dim)
        self.speech_pos_emb = Positions(s["max_speech_tokens"] + 4, dim)
        self.text_head = nn.Linear(dim, s["text_vocab"], bias=False)      # training only; loaded all the same
        self.speech_head = nn.Linear(dim, s["speech_vocab"], bias=False)

    @classmethod
    def load(cls, folder: str | Path, device: str = "cpu", dtype: torch.dtype = torch.float32) -> "T3":
        from safetensors.torch import load_file

        folder = Path(folder)
        model = cls(read_config(folder).get("t3"))
        model.load_state_dict(load_file(str(folder / "t3_cfg.safetensors")))      # strict, as the package
        return model.to(device=device, dtype=dtype).eval()

    def conditioning(self, voice: Voice, exaggeration: float) -> torch.Tensor:
        """[1, 1 + queries + 1, dim]: speaker, resampled prompt speech, exaggeration."""
        w = self.speech_head.weight
        tokens = voice.prompt_tokens.to(w.device).long()
        prompt = self.speech_emb(tokens) + self.speech_pos_emb(0, tokens.shape[1])
        enc = self.cond_enc
        speaker = enc.spkr_enc(voice.speaker.to(w.device, w.dtype).view(-1, enc.spkr_enc.in_features))[:, None]
        emotion = enc.emotion_adv_fc(torch.full((1, 1, 1), float(exaggeration), device=w.device, dtype=w.dtype))
        return torch.cat([speaker, enc.perceiver(prompt), emotion], dim=1)

    def prompt(self, voice: Voice, text_ids: list[int], exaggeration: float) -> torch.Tensor:
        """The cond and uncond rows [2, L, dim] of one request, ending with the start-of-speech input."""
        w = self.speech_head.weight
        ids = torch.tensor(text_ids, device=w.device)
        cond = self.conditioning(voice, exaggeration)[0]
        text_pos = self.text_pos_emb(0, len(text_ids))
        text = self.text_emb(ids) + text_pos
        start = self.speech_emb(torch.tensor([START_SPEECH], device=w.device)) + self.speech_pos_emb(0, 1)
        rows = [torch.cat([cond, t, start, start]) for t in (text, text_pos)]     # uncond: text zeroed
        return torch.stack(rows)

    def logits(self, voice: Voice, text_ids: list[int], speech_ids: list[int], exaggeration: float) -> torch.Tensor:
        """Teacher-forced speech logits [2, len(speech_ids) + 1, V] (cond, uncond) after the prompt: what the
        decode loop sees at each step when it generated `speech_ids`."""
        w = self.speech_head.weight
        embeds = self.prompt(voice, text_ids, exaggeration)
        if speech_ids:
            ids = torch.tensor(speech_ids, device=w.device)
            later = self.speech_emb(ids) + self.speech_pos_emb(1, len(speech_ids))
            embeds = torch.cat([embeds, later.expand(2, -1, -1)], dim=1)
        hidden = self.tfmr(inputs_embeds=embeds).last_hidden_state
        return self.speech_head(hidden[:, -(len(speech_ids) + 1):]).float()


def process_logits(cond: torch.Tensor, uncond: torch.Tensor, generated: torch.Tensor, s: Sampling) -> torch.Tensor:
    """One request's next-token scores [1, V] (the order of the package's loop: guidance, repetition
    penalty over `generated` [1, n], temperature, min-p, top-p; transformers' processors' arithmetic)."""
    scores = cond + torch.as_tensor(s.cfg_weight, dtype=cond.dtype, device=cond.device) * (cond - uncond)
    seen = scores.gather(1, generated)
    scores = scores.scatter(1, generated, torch.where(seen < 0, seen * s.repetition_penalty,
                                                      seen / s.repetition_penalty))
    if s.temperature == 0:
        return scores
    if s.temperature != 1.0:
        scores = scores / s.temperature
    # min-p: drop tokens less likely than min_p times the best one (the best always stays)
    probs = scores.softmax(dim=-1)
    drop = probs < s.min_p * probs.max(dim=-1, keepdim=True).values
    order = scores.argsort(dim=-1, descending=True)
    sorted_drop = drop.gather(1, order)
    sorted_drop[..., :1] = False
    scores = scores.masked_fill(sorted_drop.scatter(1, order, sorted_drop), -math.inf)
    # top-p: drop the least likely tokens whose total probability stays within 1 - top_p
    ascending, order = scores.sort(dim=-1, descending=False)
    sorted_drop = ascending.softmax(dim=-1).cumsum(dim=-1) <= 1 - s.top_p
    sorted_drop[..., -1:] = False
    return scores.masked_fill(sorted_drop.scatter(1, order, sorted_drop), -math.inf)


def next_token(scores: torch.Tensor, temperature: float, gen: torch.Generator) -> int:
    if temperature == 0:
        return int(scores.argmax(dim=-1))
    # drawn on the CPU from the request's generator: the draw torch.multinomial makes after
    # torch.manual_seed(seed), on any device
    return int(torch.multinomial(scores.softmax(dim=-1).cpu(), 1, generator=gen))


@torch.inference_mode()
def generate_tokens(model: T3, voice: Voice | None, jobs: list[T3Job]) -> list[tuple[list[int], str]]:
    """Every job's speech tokens (control tokens dropped) and why it ended ("stop" or "length"), all jobs
    in one loop: rows 2i / 2i+1 are job i's cond / uncond rows, left-padded to the longest prompt (a cloned
    voice's prompt may be shorter). `voice` serves the jobs that bring none."""
    from transformers import DynamicCache

    w = model.speech_head.weight
    prompts = [model.prompt(j.voice or voice, j.text_ids, j.sampling.exaggeration) for j in jobs]
    width = max(p.shape[1] for p in prompts)
    pads = [width - p.shape[1] for p in prompts for _ in range(2)]
    embeds = torch.cat([F.pad(r, (0, 0, width - r.shape[0], 0))[None] for p in prompts for r in p])
    padded = any(pads)
    mask = torch.tensor([[0] * pad + [1] * (width - pad) for pad in pads], device=w.device)
    gens = [torch.Generator().manual_seed(j.seed) for j in jobs]
    generated = [[START_SPEECH] for _ in jobs]
    done: list[str | None] = [None] * len(jobs)
    cache = DynamicCache()
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    step_input, step = embeds, 0
    while True:
        out = model.tfmr(inputs_embeds=step_input, past_key_values=cache, use_cache=True,
                         attention_mask=mask if padded else None, position_ids=positions if padded else None)
        logits = model.speech_head(out.last_hidden_state[:, -1])
        for i, job in enumerate(jobs):
            if done[i]:
                continue
            ids = torch.tensor([generated[i]], device=w.device)
            scores = process_logits(logits[2 * i:2 * i + 1], logits[2 * i + 1:2 * i + 2], ids, job.sampling)
            token = next_token(scores, job.sampling.temperature, gens[i])
            generated[i].append(token)
            if token == STOP_SPEECH:
                done[i] = "stop"
            elif len(generated[i]) - 1 >= job.max_new_tokens:
                done[i] = "length"
        step += 1
        if all(done):
            break
        last = torch.tensor([g[-1] for g in generated for _ in range(2)], device=w.device)
        step_input = (model.speech_emb(last) + model.speech_pos_emb(step, 1))[:, None]
        mask = torch.cat([mask, torch.ones_like(mask[:, :1])], dim=1)
        positions = positions[:, -1:] + 1
    return [([t for t in g[1:] if t < SPEECH_VOCAB], reason) for g, reason in zip(generated, done)]


def load_voice(folder: str | Path) -> tuple[Voice, dict]:
    """conds.pt, the built-in voice: T3's part and S3Gen's reference (prompt tokens, prompt mel, x-vector)."""
    raw = torch.load(Path(folder) / "conds.pt", map_location="cpu", weights_only=True)
    t3 = raw["t3"]
    return Voice(t3["speaker_emb"], t3["cond_prompt_speech_tokens"]), raw["gen"]
