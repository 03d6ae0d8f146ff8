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

The codec is written against transformers' DAC and HuBERT parts (HiggsAudioV2TokenizerModel itself
imports torchaudio, which serving does not need), in two halves:
- decoding: RVQ codebook lookup + project_out per codebook, fc2, DAC decoder with the model's output
  padding and without tanh;
- encoding (voice cloning, CodecEncoder): a reference clip -> its 8 codebooks of codes, which follow
  the text in the prompt. The clip is prepared as the release prepares it (prepare_reference: loudness,
  silence trimming, whole frames), resampled with torchaudio's sinc kernel rebuilt here (`resample`).
  With a reference the duration estimate scales by the reference's text and frame count, and the new
  speech gets the reference's loudness (a quiet reference's RMS) instead of a 0.5 peak.
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

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from triton_omni.media.audio_signal import resample

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


# -- the codec (HiggsAudioV2 tokenizer) ----------------------------------------------------------------

@dataclass
class CodecSizes:
    hidden: int
    acoustic_hidden: int
    semantic_hidden: int
    hop: int
    frame_rate: int
    num_quantizers: int


def codec_sizes(config: dict) -> CodecSizes:
    """HiggsAudioV2TokenizerConfig's derived sizes."""
    acoustic, semantic = config["acoustic_model_config"], config["semantic_model_config"]
    hop = int(np.prod(acoustic["downsampling_ratios"]))
    frame_rate = math.ceil(config["sample_rate"] / hop)
    bits = math.ceil(math.log2(config["codebook_size"]))
    return CodecSizes(hidden=acoustic["hidden_size"] + semantic["hidden_size"], acoustic_hidden=acoustic["hidden_size"],
                      semantic_hidden=semantic["hidden_size"], hop=hop, frame_rate=frame_rate,
                      num_quantizers=int(1000 * config["target_bandwidths"][-1] // (frame_rate * bits)))


class _Unit(nn.Module):
    """The semantic stacks' residual unit (HiggsAudioV2TokenizerResidualUnit)."""

    def __init__(self, config: dict, channels: int, dilation: int):
        super().__init__()
        k = config["unit_kernel_size"]
        self.activation = nn.ELU()
        self.conv1 = nn.Conv1d(channels, channels, k, padding=((k - 1) // 2) * dilation, dilation=dilation, bias=False)
        self.conv2 = nn.Conv1d(channels, channels, 1, bias=False)

    def forward(self, x):
        return x + self.conv2(self.activation(self.conv1(self.activation(x))))


class _EncoderBlock(nn.Module):
    def __init__(self, config: dict, cin: int, cout: int, stride: int):
        super().__init__()
        self.res_units = nn.ModuleList([_Unit(config, cin, d) for d in config["block_dilations"]])
        kernel = 3 if stride == 1 else 2 * stride
        self.conv = nn.Conv1d(cin, cout, kernel, stride=stride, padding=(kernel - 1) // 2)

    def forward(self, x):
        for unit in self.res_units:
            x = unit(x)
        return self.conv(x)


class SemanticEncoder(nn.Module):
    """The codec's semantic encoder (its parameter names): HuBERT features -> the semantic half of a frame."""

    def __init__(self, config: dict):
        super().__init__()
        h, k = config["semantic_model_config"]["hidden_size"], config["kernel_size"]
        self.conv = nn.Conv1d(h, h, k, 1, k // 2, bias=False)
        chans = [h] + [int(h * r) for r in config["channel_ratios"]]
        self.conv_blocks = nn.ModuleList([_EncoderBlock(config, chans[i], chans[i + 1], s)
                                          for i, s in enumerate(config["strides"])])

    def forward(self, x):
        x = self.conv(x)
        for block in self.conv_blocks:
            x = block(x)
        return x


class SemanticDecoder(nn.Module):
    """The codec's semantic decoder (training only; here for its parameter names). Stride-1 blocks, as
    the release config has."""

    def __init__(self, config: dict):
        super().__init__()
        h, k = config["semantic_model_config"]["hidden_size"], config["kernel_size"]
        if any(s != 1 for s in config["strides"]):
            raise ValueError("only stride-1 semantic blocks are supported")
        ratios = config["channel_ratios"]
        chans = [int(h * r) for r in ratios] + [h]
        self.conv1 = nn.Conv1d(h, chans[0], k, 1, k // 2, bias=False)
        self.conv_blocks = nn.ModuleList()
        for i in range(len(ratios)):
            block = nn.Module()
            block.conv = nn.Conv1d(chans[i], chans[i + 1], 3, 1, 1)
            block.res_units = nn.ModuleList([_Unit(config, chans[i + 1], d) for d in config["block_dilations"]])
            self.conv_blocks.append(block)
        self.conv2 = nn.Conv1d(h, h, k, 1, k // 2, bias=False)


class Codec(nn.Module):
    """The decoding half of HiggsAudioV2TokenizerModel, under its parameter names."""

    def __init__(self, config: dict):
        super().__init__()
        from transformers import DacConfig
        from transformers.models.dac.modeling_dac import DacDecoder

        self.sizes = codec_sizes(config)
        self.sample_rate = config["sample_rate"]
        self.acoustic_decoder = DacDecoder(DacConfig(**{k: v for k, v in config["acoustic_model_config"].items()
                                                        if k != "model_type"}))
        for m in self.acoustic_decoder.modules():       # HiggsAudioV2TokenizerModel._adjust_dac_decoder
            if isinstance(m, nn.ConvTranspose1d):
                m.output_padding = (m.stride[0] % 2,)
        self.acoustic_decoder.tanh = nn.Identity()
        self.quantizer = nn.Module()
        self.quantizer.quantizers = nn.ModuleList()
        for _ in range(self.sizes.num_quantizers):
            q = nn.Module()
            q.codebook = nn.Module()
            q.codebook.register_buffer("embed", torch.zeros(config["codebook_size"], config["codebook_dim"]))
            q.project_out = nn.Linear(config["codebook_dim"], self.sizes.hidden)
            self.quantizer.quantizers.append(q)
        self.fc2 = nn.Linear(self.sizes.hidden, self.sizes.acoustic_hidden)

    @classmethod
    def load(cls, folder: str | Path, device: str = "cpu") -> "Codec":
        return _load_codec_half(cls, folder, device)

    @torch.inference_mode()
    def decode(self, codes: torch.Tensor) -> torch.Tensor:
        """codes [B, C, T] -> waveforms [B, T * hop] (HiggsAudioV2TokenizerModel.decode)."""
        quantized = torch.full((), 0.0, device=codes.device)
        for q, idx in zip(self.quantizer.quantizers, codes.transpose(0, 1)):
            quantized = quantized + q.project_out(F.embedding(idx, q.codebook.embed)).permute(0, 2, 1)
        acoustic = self.fc2(quantized.transpose(1, 2)).transpose(1, 2)
        return self.acoustic_decoder(acoustic)[:, 0]


def _load_codec_half(cls, folder: str | Path, device: str):
    """One half of the codec (its module under the model's names) with the weights of the folder's
    model.safetensors that it has; the other half's are not read."""
    from safetensors import safe_open

    folder = Path(folder)
    module = cls(json.loads((folder / "config.json").read_text()))
    ours = module.state_dict()
    with safe_open(str(folder / "model.safetensors"), framework="pt") as f:
        state = {k: f.get_tensor(k) for k in f.keys() if k in ours}
    # HuBERT's masked_spec_embed is for training-time masking; the release file may leave it out
    missing = sorted(k for k in set(ours) - set(state) if not k.endswith("masked_spec_embed"))
    if missing:
        raise ValueError(f"{folder}: codec weights missing: {missing[:5]}")
    module.load_state_dict(state, strict=False)
    return module.to(device).eval()


# -- voice cloning: a reference clip -> its codes (create_voice_clone_prompt) ----------------------------

class CodecEncoder(nn.Module):
    """The encoding half of HiggsAudioV2TokenizerModel, under its parameter names: 24 kHz audio ->
    codes [num_quantizers, frames] (HiggsAudioV2TokenizerModel.encode at its highest bandwidth).
    A frame joins the DAC encoder's acoustic features with semantic ones: HuBERT on the clip resampled
    to 16 kHz (padded 10 ms each side; the mean of all its hidden states, every k-th frame to reach
    25 Hz) through the semantic conv stack. `fc` mixes them, then residual VQ: each quantizer takes the
    codebook entry nearest to project_in(residual) and subtracts its project_out."""

    def __init__(self, config: dict):
        super().__init__()
        from transformers import DacConfig, HubertConfig, HubertModel
        from transformers.models.dac.modeling_dac import DacEncoder

        self.sizes = codec_sizes(config)
        self.sample_rate, self.semantic_rate = config["sample_rate"], config["semantic_sample_rate"]
        self.semantic_step = int(self.sizes.hop / (self.sample_rate / self.semantic_rate) / config["downsample_factor"])
        sub = {k: v for k, v in config["acoustic_model_config"].items() if k != "model_type"}
        self.acoustic_encoder = DacEncoder(DacConfig(**sub))
        self.encoder_semantic = SemanticEncoder(config)
        sub = {k: v for k, v in config["semantic_model_config"].items() if k != "model_type"}
        self.semantic_model = HubertModel(HubertConfig(**sub))
        self.fc = nn.Linear(self.sizes.hidden, self.sizes.hidden)
        self.quantizer = nn.Module()
        self.quantizer.quantizers = nn.ModuleList()
        for _ in range(self.sizes.num_quantizers):
            q = nn.Module()
            q.codebook = nn.Module()
            q.codebook.register_buffer("embed", torch.zeros(config["codebook_size"], config["codebook_dim"]))
            q.project_in = nn.Linear(self.sizes.hidden, config["codebook_dim"])
            q.project_out = nn.Linear(config["codebook_dim"], self.sizes.hidden)
            self.quantizer.quantizers.append(q)

    @classmethod
    def load(cls, folder: str | Path, device: str = "cpu") -> "CodecEncoder":
        return _load_codec_half(cls, folder, device)

    def acoustic_frames(self, samples: int) -> int:
        """The DAC encoder's output length, conv by conv (the model's _get_conv1d_output_lengths)."""
        for m in self.acoustic_encoder.modules():
            if isinstance(m, nn.Conv1d):
                samples = int((samples + 2 * m.padding[0] - m.dilation[0] * (m.kernel_size[0] - 1) - 1) / m.stride[0]
                              + 1)
        return samples

    @torch.inference_mode()
    def encode(self, wave: torch.Tensor) -> torch.Tensor:
        """wave [S] at 24 kHz -> codes [num_quantizers, frames] (long)."""
        x = wave.reshape(1, 1, -1).to(self.fc.weight)
        semantic_in = F.pad(resample(x, self.sample_rate, self.semantic_rate)[:, 0], (160, 160))
        hidden = self.semantic_model(semantic_in, output_hidden_states=True).hidden_states
        semantic = torch.stack(hidden, dim=1).mean(dim=1)[:, ::self.semantic_step]
        semantic = self.encoder_semantic(semantic.transpose(1, 2))
        if self.acoustic_frames(x.shape[-1]) != semantic.shape[-1]:     # the model pads only then
            x = F.pad(x, (self.sizes.hop // 2, self.sizes.hop // 2))
        joined = torch.cat([self.acoustic_encoder(x), semantic], dim=1)
        residual = self.fc(joined.transpose(1, 2)).transpose(1, 2)       # [1, H, T]
        codes = []
        for q in self.quantizer.quantizers:
            h = q.project_in(residual.permute(0, 2, 1)).reshape(-1, q.codebook.embed.shape[1])
            embed = q.codebook.embed.t()
            # nearest entry by squared distance, written as the model writes it (same rounding, same ties)
            dist = -(h.pow(2).sum(1, keepdim=True) - 2 * h @ embed + embed.pow(2).sum(0, keepdim=True))
            idx = dist.max(dim=-1).indices.view(1, -1)
            residual = residual - q.project_out(F.embedding(idx, q.codebook.embed)).permute(0, 2, 1)
            codes.append(idx[0])
        return torch.stack(codes)


def prepare_reference(wave: np.ndarray, rate: int, hop: int) -> tuple[np.ndarray, float]:
    """A clip as the release encodes it when given its transcript (create_voice_clone_prompt,
    preprocess_prompt on): its RMS (which later sets the new speech's loudness), a quiet clip raised to
    RMS 0.1, silences over 200 ms shortened to 200 ms, the edges to 100 ms (lead) and 200 ms (trail),
    then cut to whole frames of `hop` samples. Returns (wave, rms); the wave may come back empty."""
    wave = np.asarray(wave, dtype=np.float32)[None]     # [1, S] float32, the release's arithmetic
    rms = float(np.sqrt(np.mean(wave ** 2)))
    if 0 < rms < 0.1:
        wave = wave * 0.1 / rms
    wave = remove_silence(wave[0], rate, mid_ms=200, lead_ms=100, trail_ms=200)
    return wave[:len(wave) - len(wave) % hop], rms


def remove_silence(wave: np.ndarray, rate: int, mid_ms: int = 500, lead_ms: int = 100, trail_ms: int = 100,
                   thresh_db: float = -50.0) -> np.ndarray:
    """omnivoice.utils.audio.remove_silence, which runs pydub on 16-bit samples: silences longer than
    mid_ms (windows of mid_ms every 10 ms with an integer RMS at most thresh_db) shrink to mid_ms, then
    the leading and trailing silence (10 ms chunks under thresh_db) to lead_ms / trail_ms. pydub's
    millisecond arithmetic and integer RMS are kept, so the samples kept are the release's."""
    pcm = (np.asarray(wave, dtype=np.float32) * 32768.0).clip(-32768, 32767).astype(np.int16)
    per_ms, limit = rate / 1000.0, 10 ** (thresh_db / 20) * 32768

    def length(x) -> int:
        return round(1000 * (len(x) / rate))

    def cut(x, a, b):                                   # AudioSegment[a:b]: ms, zero-filled past the end
        n = length(x)
        a, b = int(min(a, n) * per_ms), int(min(b, n) * per_ms)
        piece = x[a:b]
        return np.concatenate([piece, np.zeros(b - a - len(piece), np.int16)]) if len(piece) < b - a else piece

    def rms(x) -> int:                                  # audioop.rms
        return int(math.sqrt(np.square(x, dtype=np.float64).sum() / len(x))) if len(x) else 0

    def quiet(x) -> bool:                               # dBFS < thresh_db
        r = rms(x)
        return not r or 20 * math.log(r / 32768, 10) < thresh_db

    def leading(x) -> int:                              # detect_leading_silence
        t = 0
        while quiet(cut(x, t, t + 10)) and t < length(x):
            t += 10
        return min(t, length(x))

    n = length(pcm)
    silent: list[list[int]] = []                        # detect_silence(min_silence_len=mid_ms, seek_step=10)
    if n >= mid_ms:
        last = n - mid_ms
        for i in [*range(0, last + 1, 10), *([last] if last % 10 else [])]:
            if rms(cut(pcm, i, i + mid_ms)) <= limit:
                if silent and (i == silent[-1][1] - mid_ms + 10 or i <= silent[-1][1]):
                    silent[-1][1] = i + mid_ms          # continues the silence
                else:
                    silent.append([i, i + mid_ms])
    if not silent:                                      # detect_nonsilent
        loud = [[0, n]]
    elif silent[0] == [0, n]:
        loud = []
    else:
        loud, prev = [], 0
        for a, b in silent:
            loud.append([prev, a])
            prev = b
        if prev != n:
            loud.append([prev, n])
        if loud[0] == [0, 0]:
            loud.pop(0)
    ranges = [[a - mid_ms, b + mid_ms] for a, b in loud]     # split_on_silence(keep_silence=mid_ms)
    for r1, r2 in zip(ranges, ranges[1:]):              # overlapping neighbours meet halfway
        if r2[0] < r1[1]:
            r1[1] = r2[0] = (r1[1] + r2[0]) // 2
    pieces = [cut(pcm, max(a, 0), min(b, n)) for a, b in ranges]
    pcm = np.concatenate(pieces) if pieces else np.zeros(0, np.int16)
    pcm = cut(pcm, max(0, leading(pcm) - lead_ms), length(pcm))[::-1]
    pcm = cut(pcm, max(0, leading(pcm) - trail_ms), length(pcm))[::-1]
    return pcm.astype(np.float32) / 32768.0


def finish(wave: np.ndarray, rate: int, ref_rms: float | None = None, trim_silence: bool = True,
           pad_s: float = 0.1, fade_s: float = 0.1) -> np.ndarray:
    """The release's post-processing (_post_process_audio, fade_and_pad_audio): long silences removed
    (`trim_silence`, postprocess_output), peak 0.5 without a reference voice, a quiet reference's loudness
    with one; a fade in and out, then silence padding on both sides. float32 numpy, as the release."""
    if trim_silence:
        wave = remove_silence(wave, rate)
    wave = np.asarray(wave, dtype=np.float32)[None]
    if ref_rms is not None and ref_rms < 0.1:
        wave = wave * ref_rms / 0.1
    elif ref_rms is None:
        peak = np.abs(wave).max() if wave.size else 0.0
        if peak > 1e-6:
            wave = wave / peak * 0.5
    if wave.shape[-1] == 0:
        return wave[0]
    fade, pad = int(fade_s * rate), int(pad_s * rate)
    wave = wave.copy()
    k = min(fade, wave.shape[-1] // 2)
    if k > 0:
        wave[..., :k] *= np.linspace(0, 1, k, dtype=np.float32)[None]
        wave[..., -k:] *= np.linspace(1, 0, k, dtype=np.float32)[None]
    if pad > 0:
        silence = np.zeros((1, pad), dtype=wave.dtype)
        wave = np.concatenate([silence, wave, silence], axis=-1)
    return wave[0]
