"""OmniVoice (k2-fsa, the `omnivoice` package 0.2.1): text -> 8 codebooks of 25 Hz audio tokens by
iterative masked decoding with a bidirectional Qwen3 -> the HiggsAudioV2 tokenizer's DAC decoder -> 24 kHz.

What the release does (OmniVoice.generate / _generate_iterative), followed here number for number:
- prompt: style tokens `<|lang_start|>None<|lang_end|><|instruct_start|>{voice design or None}<|instruct_end|>`
  (with a reference voice, `<|denoise|>` first), the text `<|text_start|>{ref text + text}<|text_end|>` (the
  reference's transcript punctuated), each
  id repeated over the 8 codebook rows, then the reference voice's codes if any, then T target frames
  set to the mask id. T is a rule-based estimate (character weights per script, scaled so that
  "Nice to meet you." is 25 frames, or from the reference voice's text and length), divided by speed.
- embeddings: a text position is the LLM's token embedding, an audio position the sum of its 8 codes'
  embeddings (one table, codebook c at offset c * audio_vocab_size).
- the LLM (transformers' Qwen3Model, used as is) attends bidirectionally; 8 linear heads give every
  position's logits per codebook.
- N steps (32): the conditional prompt and an unconditional one (the target frames alone) run in one
  batch; their log-probabilities mix (classifier-free guidance); each masked position takes its best
  token, with that log-probability as confidence, minus a penalty per codebook index, plus Gumbel noise;
  the k most confident are fixed, k following a shifted schedule that fixes all of them by step N.
The noise is the only randomness (and token sampling, with temperature > 0). The release draws it from
torch's global generator; here every request has a generator of its own, seeded with its seed: a
request's tokens do not depend on its batch neighbours, and a request alone equals the release's run
after torch.manual_seed(seed).

The codec, reference-clip preparation and the finishing of new speech: omnivoice/codec.py.
"""
from __future__ import annotations

import bisect
import json
import math
import re
import unicodedata
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

# -- text front end (omnivoice.utils: duration, voice_design, text) ------------------------------------

# RuleDurationEstimator's script weights by Unicode block end, adjacent blocks of equal weight merged
# (the lookup is a bisect on the ends, so merging does not change any character's weight)
_BLOCK_ENDS, _BLOCK_WEIGHTS = zip(*[
    (0x058F, 1.0), (0x08FF, 1.5), (0x0DFF, 1.8), (0x0EFF, 1.5), (0x109F, 1.8), (0x10FF, 1.0), (0x11FF, 2.5),
    (0x139F, 3.0), (0x177F, 1.0), (0x17FF, 1.8), (0x18FF, 1.0), (0x1C7F, 1.8), (0x1CBF, 1.0), (0x1CFF, 1.8),
    (0x1EFF, 1.0), (0x30FF, 2.2), (0x312F, 3.0), (0x318F, 2.5), (0xA4CF, 3.0), (0xA7FF, 1.0), (0xA82F, 1.8),
    (0xA87F, 1.0), (0xA95F, 1.8), (0xA97F, 2.5), (0xAAFF, 1.8), (0xAB2F, 3.0), (0xABBF, 1.0), (0xABFF, 1.8),
    (0xD7AF, 2.5), (0xFAFF, 3.0), (0xFDFF, 1.5), (0xFE6F, 1.0), (0xFEFF, 1.5), (0xFFEF, 1.0)])
DEFAULT_REF_TEXT, DEFAULT_REF_FRAMES = "Nice to meet you.", 25       # the release's fallback reference


@lru_cache(maxsize=4096)
def char_weight(char: str) -> float:
    code = ord(char)
    if 65 <= code <= 90 or 97 <= code <= 122:
        return 1.0
    if code == 32:
        return 0.2
    if code == 0x0640:                  # Arabic tatweel
        return 0.0
    category = unicodedata.category(char)
    if category.startswith("M"):
        return 0.0
    if category.startswith(("P", "S")):
        return 0.5
    if category.startswith("Z"):
        return 0.2
    if category.startswith("N"):
        return 3.5
    i = bisect.bisect_left(_BLOCK_ENDS, code)
    if i < len(_BLOCK_ENDS):
        return _BLOCK_WEIGHTS[i]
    return 3.0 if code > 0x20000 else 1.0


def estimate_frames(text: str, ref_text: str | None = None, ref_frames: int | None = None,
                    speed: float = 1.0) -> int:
    """How many 25 Hz frames the text takes (RuleDurationEstimator + OmniVoice._estimate_target_tokens)."""
    if not ref_frames or not ref_text:
        ref_text, ref_frames = DEFAULT_REF_TEXT, DEFAULT_REF_FRAMES
    ref_weight = sum(char_weight(c) for c in ref_text)
    if ref_weight == 0:
        est = 0.0
    else:
        est = sum(char_weight(c) for c in text) / (ref_weight / ref_frames)
        if est < 50:                    # short texts are stretched (power curve, strength 3)
            est = 50 * (est / 50) ** (1.0 / 3)
    if speed > 0 and speed != 1.0:
        est = est / speed
    return max(1, int(est))


# Voice design attributes: English item -> Chinese (None: no counterpart); each group allows one item.
_GROUPS = [
    {"male": "男", "female": "女"},
    {"child": "儿童", "teenager": "少年", "young adult": "青年", "middle-aged": "中年", "elderly": "老年"},
    {"very low pitch": "极低音调", "low pitch": "低音调", "moderate pitch": "中音调", "high pitch": "高音调",
     "very high pitch": "极高音调"},
    {"whisper": "耳语"},
    {f"{a} accent": None for a in ("american", "british", "australian", "chinese", "canadian", "indian", "korean",
                                   "portuguese", "russian", "japanese")},
    {d: None for d in ("河南话", "陕西话", "四川话", "贵州话", "云南话", "桂林话", "济南话", "石家庄话", "甘肃话",
                       "宁夏话", "青岛话", "东北话")},
]
EN_TO_ZH = {en: zh for g in _GROUPS for en, zh in g.items() if zh}
ZH_TO_EN = {zh: en for en, zh in EN_TO_ZH.items()}
VOICE_ITEMS = {item for g in _GROUPS for en, zh in g.items() for item in (en, zh) if item}
_CJK = re.compile(r"[\u4e00-\u9fff]")


def voice_design(description: str, text: str) -> str:
    """A voice description ("female, low pitch, british accent") in the release's instruct form
    (omnivoice's _resolve_instruct). ValueError names what is wrong."""
    items = [x for x in re.split(r"\s*[,，]\s*", description.strip()) if x]
    norm = [x.strip().lower() for x in items]
    unknown = [x for x, n in zip(items, norm) if n not in VOICE_ITEMS]
    if unknown:
        raise ValueError(f"unknown voice attribute(s) {', '.join(map(repr, unknown))}; use 'auto' or items from "
                         f"{', '.join(sorted(i for i in VOICE_ITEMS if not _CJK.search(i)))}")
    dialect, accent = any(n.endswith("话") for n in norm), any(" accent" in n for n in norm)
    if dialect and accent:
        raise ValueError("a Chinese dialect and an English accent cannot be combined")
    use_zh = dialect or (not accent and bool(_CJK.search(text)))
    norm = [EN_TO_ZH.get(n, n) if use_zh else ZH_TO_EN.get(n, n) for n in norm]
    for g in _GROUPS:
        hits = [n for n in norm if n in g or n in g.values()]
        if len(hits) > 1:
            raise ValueError(f"conflicting voice attributes {' vs '.join(map(repr, hits))} (one of each kind)")
    return ("，" if any(_CJK.search(n) for n in norm) else ", ").join(norm)


def combine_text(text: str, ref_text: str | None = None) -> str:
    """The text the model reads (omnivoice's _combine_text)."""
    full = (ref_text.strip() + " " + text.strip()) if ref_text else text.strip()
    full = re.sub(r"[\r\n]+", "", full).replace("\uff08", "(").replace("\uff09", ")")
    full = re.sub(r"[ \t]+", " ", full)
    return re.sub(r"(?<=[\u4e00-\u9fff])\s+|\s+(?=[\u4e00-\u9fff])", "", full)


# a reference transcript that ends without one of these gets a full stop (the release's add_punctuation)
_END_MARKS = set(";:,.!?…)]}\"'“”‘’；：，。！？、）】")


def punctuate(text: str) -> str:
    """The reference transcript as the release reads it: stripped, and ending in punctuation ("。" for
    Chinese text, else ".") so that the new text starts a sentence of its own."""
    text = text.strip()
    if text and text[-1] not in _END_MARKS:
        text += "。" if _CJK.search(text) else "."
    return text


_NONVERBAL = re.compile(r"\[(laughter|sigh|confirmation-en|question-en|question-ah|question-oh|question-ei|question-yi|"
                        r"surprise-ah|surprise-oh|surprise-wa|surprise-yo|dissatisfaction-hnn)\]")


def prompt_ids(tokenizer, text: str, instruct: str | None = None, ref_text: str | None = None,
               language: str | None = None, denoise: bool = False) -> list[int]:
    """Style then text token ids, as OmniVoice._prepare_inference_inputs tokenizes them (non-verbal tags
    such as [laughter] on their own, so they get the same ids in any language)."""
    style = "<|denoise|>" if denoise else ""
    style += f"<|lang_start|>{language or 'None'}<|lang_end|><|instruct_start|>{instruct or 'None'}<|instruct_end|>"
    ids = list(tokenizer(style).input_ids)
    wrapped = f"<|text_start|>{combine_text(text, ref_text)}<|text_end|>"
    pieces, last = [], 0
    for m in _NONVERBAL.finditer(wrapped):
        pieces += [wrapped[last:m.start()], m.group()]
        last = m.end()
    pieces.append(wrapped[last:])
    for piece in pieces:
        if piece:
            ids += tokenizer(piece, add_special_tokens=False).input_ids
    return ids


# -- the model -------------------------------------------------------------------------------------------

@dataclass
class Settings:
    """OmniVoiceGenerationConfig's decoding fields (the release's defaults)."""
    num_step: int = 32
    guidance_scale: float = 2.0
    t_shift: float = 0.1
    layer_penalty_factor: float = 5.0
    position_temperature: float = 5.0


class OmniVoiceModel(nn.Module):
    def __init__(self, config: dict):
        super().__init__()
        from transformers import Qwen3Config, Qwen3Model

        llm_config = Qwen3Config(**{k: v for k, v in config["llm_config"].items() if k != "model_type"})
        llm_config._attn_implementation = PAIRED_ROWS
        self.llm = Qwen3Model(llm_config)
        self.codebooks, self.vocab = config["num_audio_codebook"], config["audio_vocab_size"]
        self.mask_id = config["audio_mask_id"]
        hidden = llm_config.hidden_size
        self.audio_embeddings = nn.Embedding(self.codebooks * self.vocab, hidden)
        self.audio_heads = nn.Linear(hidden, self.codebooks * self.vocab, bias=False)
        self.register_buffer("codebook_layer_offsets", torch.arange(self.codebooks) * self.vocab)

    @classmethod
    def load(cls, folder: str | Path, device: str = "cpu", dtype: torch.dtype = torch.float32) -> "OmniVoiceModel":
        from safetensors.torch import load_file

        folder = Path(folder)
        model = cls(json.loads((folder / "config.json").read_text()))
        state = {}
        for path in sorted(folder.glob("*.safetensors")):
            state.update(load_file(str(path)))
        missing, unexpected = model.load_state_dict(state, strict=False)
        missing = [k for k in missing if k != "codebook_layer_offsets"]     # a buffer computed from the config
        if missing or unexpected:
            raise ValueError(f"{folder}: weights missing {missing[:5]}, unexpected {unexpected[:5]}")
        return model.to(device=device, dtype=dtype).eval()

    def forward(self, ids: torch.Tensor, audio_mask: torch.Tensor, attention: torch.Tensor,
                row_lengths: list[int] | None = None) -> torch.Tensor:
        """ids [B, C, S], audio_mask [B, S], attention [B, 1, S, S] (bool) -> logits [B, C, S, V] float32.
        row_lengths: see paired_rows_attention."""
        text = self.llm.embed_tokens(ids[:, 0, :])
        shifted = ids * audio_mask.unsqueeze(1) + self.codebook_layer_offsets.view(1, -1, 1)
        audio = self.audio_embeddings(shifted).sum(dim=1)
        embeds = torch.where(audio_mask.unsqueeze(-1), audio, text)
        hidden = self.llm(inputs_embeds=embeds, attention_mask=attention, return_dict=True, row_lengths=row_lengths)[0]
        b, s, _ = hidden.shape
        return self.audio_heads(hidden).view(b, s, self.codebooks, self.vocab).permute(0, 2, 1, 3).float()


PAIRED_ROWS = "omnivoice_paired_rows"


def paired_rows_attention(module, query, key, value, attention_mask, row_lengths=None, **kwargs):
    """SDPA (the release's attention) per request: with `row_lengths` (request i's length c_i), rows i and
    B + i (its conditional and unconditional branch) attend as a pair over their first c_i positions
    only, exactly the batch of two and the length the release runs a request alone with. Attention over
    a longer, masked key range rounds differently (the kernel's sums get longer), which would make a
    request's tokens depend on its batch neighbours' lengths. Positions past c_i are left at zero: no
    valid position attends to them."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    if row_lengths is None:
        return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)
    b = len(row_lengths)
    out = query.new_zeros(query.shape[0], query.shape[2], query.shape[1], value.shape[-1])
    for i, c in enumerate(row_lengths):
        rows = [i, b + i]
        o, _ = sdpa_attention_forward(module, query[rows, :, :c].contiguous(), key[rows, :, :c].contiguous(),
                                      value[rows, :, :c].contiguous(), attention_mask[rows][:, :, :c, :c], **kwargs)
        out[rows, :c] = o
    return out, None


def _register_attention() -> None:
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(PAIRED_ROWS, paired_rows_attention)
    AttentionMaskInterface.register(PAIRED_ROWS, sdpa_mask)


_register_attention()


@dataclass
class Job:
    """One request in the decode loop."""
    prompt: torch.Tensor               # [C, P] style + text ids (repeated per codebook), then reference codes
    audio_start: int                   # where the prompt's audio positions start (= P without a reference)
    frames: int                        # target frames T
    seed: int
    temperature: float = 0.0           # token sampling (0: the best token, the release's default)


def schedule(frames: int, codebooks: int, s: Settings) -> list[int]:
    """How many positions each step fixes (the release's shifted schedule, float32 time steps)."""
    t = torch.linspace(0.0, 1.0, s.num_step + 1)
    t = (s.t_shift * t / (1 + (s.t_shift - 1) * t)).tolist()
    total = rem = frames * codebooks
    out = []
    for step in range(s.num_step):
        n = rem if step == s.num_step - 1 else min(math.ceil(total * (t[step + 1] - t[step])), rem)
        out.append(int(n))
        rem -= int(n)
    return out


def gumbel(logits: torch.Tensor, temperature: float, gen: torch.Generator) -> torch.Tensor:
    # drawn on the CPU from the request's generator: the numbers torch.rand_like draws after
    # torch.manual_seed(seed), on any device
    u = torch.rand(logits.shape, generator=gen, dtype=logits.dtype).to(logits.device)
    return logits / temperature - torch.log(-torch.log(u + 1e-10) + 1e-10)


def predict(cond: torch.Tensor, uncond: torch.Tensor, mask_id: int, guidance: float, temperature: float,
            gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Tokens and their confidence from guided log-probabilities (_predict_tokens_with_scoring)."""
    if guidance != 0:
        c, u = F.log_softmax(cond, dim=-1), F.log_softmax(uncond, dim=-1)
        log_probs = torch.log_softmax(c + guidance * (c - u), dim=-1)
    else:
        log_probs = F.log_softmax(cond, dim=-1)
    log_probs[..., mask_id] = -float("inf")
    if temperature > 0.0:
        k = math.ceil(0.1 * log_probs.shape[-1])             # the best 10% only
        val, ind = log_probs.topk(k, dim=-1)
        top = torch.full_like(log_probs, float("-inf")).scatter_(-1, ind, val)
        tokens = gumbel(top, temperature, gen).argmax(dim=-1)
    else:
        tokens = log_probs.argmax(dim=-1)
    return tokens, log_probs.max(dim=-1)[0]


@torch.inference_mode()
def generate(model: OmniVoiceModel, jobs: list[Job], s: Settings) -> list[torch.Tensor]:
    """All jobs in one decode loop: row i is job i's prompt + target, row B + i its target alone (the
    unconditional branch), each padded to the longest row and attending only within itself (the
    release's batch layout). Returns each job's codes [C, T] (long, on the CPU)."""
    dev, C, mask_id, B = model.audio_heads.weight.device, model.codebooks, model.mask_id, len(jobs)
    lens = [j.prompt.shape[1] + j.frames for j in jobs]
    L = max(lens)
    ids = torch.full((2 * B, C, L), mask_id, dtype=torch.long, device=dev)
    audio = torch.zeros((2 * B, L), dtype=torch.bool, device=dev)
    attention = torch.zeros((2 * B, 1, L, L), dtype=torch.bool, device=dev)
    for i, (j, c) in enumerate(zip(jobs, lens)):
        ids[i, :, :j.prompt.shape[1]] = j.prompt.to(dev)
        audio[i, j.audio_start:c] = True
        attention[i, :, :c, :c] = True
        audio[B + i, :j.frames] = True
        attention[B + i, :, :j.frames, :j.frames] = True
        pad = torch.arange(j.frames, L, device=dev)
        attention[B + i, :, pad, pad] = True                  # padding attends to itself (no empty rows)
    tokens = [torch.full((1, C, j.frames), mask_id, dtype=torch.long, device=dev) for j in jobs]
    plans = [schedule(j.frames, C, s) for j in jobs]
    gens = [torch.Generator().manual_seed(j.seed) for j in jobs]
    penalty = torch.arange(C, device=dev).view(1, -1, 1) * s.layer_penalty_factor
    for step in range(s.num_step):
        logits = model(ids, audio, attention, lens)
        for i, (j, c) in enumerate(zip(jobs, lens)):
            k, t = plans[i][step], j.frames
            if k <= 0:
                continue
            pred, scores = predict(logits[i:i + 1, :, c - t:c], logits[B + i:B + i + 1, :, :t], mask_id,
                                   s.guidance_scale, j.temperature, gens[i])
            scores = scores - penalty
            if s.position_temperature > 0.0:
                scores = gumbel(scores, s.position_temperature, gens[i])
            scores.masked_fill_(tokens[i] != mask_id, -float("inf"))
            chosen = torch.topk(scores.flatten(), k).indices
            flat = tokens[i].flatten()
            flat[chosen] = pred.flatten()[chosen]
            tokens[i] = flat.view(1, C, t)
            ids[i, :, c - t:c] = tokens[i][0]
            ids[B + i, :, :t] = tokens[i][0]
    return [t[0].cpu() for t in tokens]
