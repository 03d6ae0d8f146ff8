"""Qwen3-TTS (12 Hz; 0.6B / 1.7B; CustomVoice, VoiceDesign, Base) talker and code predictor, loaded
from the release folder (config.json + model.safetensors with `talker.*`, `speaker_encoder.*`).

The model speaks in frames of the 12.5 Hz speech tokenizer: one frame = N codes (N = num_code_groups,
16 in the release), codebook 0 first. Per frame:

  talker      a Qwen3 decoder (q/k norm; its 3-section "mrope" reduces to plain rope for text-only
              positions) over input embeddings, not token ids. Its last hidden state h goes through
              `codec_head` -> logits of codebook 0 (vocab 3072: codes 0..2047 + control/speaker ids).
  predictor   a small Qwen3 decoder that, per frame, reads [proj(h), proj(E0(code0))] and then
              generates codes 1..N-1 one by one (input for code j+1: proj(E_j(code j)), head j).
              It starts from an empty cache every frame: a fixed N-token sequence.
  next input  embed_frame(frame) = E0(code0) + sum_j E_j(code j) (talker codec embedding for code 0,
              the predictor's embeddings for the rest) + the text stream's vector for this step.

Text enters as embeddings too: P(ids) = text_projection(text_embedding(ids)) (a 2-layer MLP from the
text width, 2048, to the talker width). `build_prompt` lays out the prefill embeddings and the text
stream exactly as the reference's `Qwen3TTSForConditionalGeneration.generate` does.

Engine interface (`Qwen3TTS`): `forward(inputs_embeds, positions, ctx)` runs the talker's layers over
the engine's paged KV cache (the same `DecoderLayer`/`Attention`/`PagedAttention` as Qwen3, so the
engine's cache binding, Triton kernels and CUDA graphs apply unchanged), `compute_logits(hidden)` is
the codec head, `embed_frame`, `text_at`, `TalkerRules` (the reference's logits processors) and
`predict_codes` (all rows at once, fixed N-1 sub-steps, device-side, capturable in a CUDA graph: the
predictor's attention, tts/code_predictor.py, keeps its own dense per-row cache, not the engine's
pages, and declares no `cache_spec`, so the engine's `cache_layers` sees only the talker's layers).

`generate_codes` (generate.py) is a plain loop over all of this (its own small paged cache, no
engine): what the engine step must do, and what the parity tests run. The same step on the AR engine: `Qwen3TTS` is a
frame model (python_backends/ar/model_runner.FrameModel: `allocate_rows`, `admit_row`,
`prefill_embeds`, `decode_embeds`, `sample_frame`), so `talker_engine` decodes talker prompts with
continuous batching, a frame per row per step, the whole step on the device.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn

from triton_omni.models.context import ForwardContext
from triton_omni.models.decoder import PACKED, DecoderModel, dense_layer
from triton_omni.models.loader import load_weights
from triton_omni.runtime.device import upload
from triton_omni.tts.code_predictor import PredictorAttention, predictor_step

Sampler = Callable[[torch.Tensor, int], torch.Tensor]     # (logits [B, V], sub-step j) -> codes [B]


def greedy(logits: torch.Tensor, step: int) -> torch.Tensor:
    return logits.argmax(-1)


# --- config --------------------------------------------------------------------------------------
def _decoder_config(d: dict, **extra) -> SimpleNamespace:
    """The fields our decoder building blocks read, from a talker / predictor config dict."""
    rope = dict(d.get("rope_scaling") or {})
    rope_type = rope.get("rope_type", rope.get("type", "default"))
    if rope_type != "default":
        raise NotImplementedError(f"rope_type {rope_type!r}: only the release's default rope is supported")
    heads = d.get("num_attention_heads", 16)
    return SimpleNamespace(
        hidden_size=d["hidden_size"], intermediate_size=d["intermediate_size"],
        num_hidden_layers=d["num_hidden_layers"], num_attention_heads=heads,
        num_key_value_heads=d.get("num_key_value_heads") or heads,
        head_dim=d.get("head_dim") or d["hidden_size"] // heads, rms_norm_eps=d.get("rms_norm_eps", 1e-6),
        attention_bias=d.get("attention_bias", False), mlp_bias=False,
        max_position_embeddings=d.get("max_position_embeddings", 32768),
        rope_parameters={"rope_type": "default", "rope_theta": float(d.get("rope_theta", 10000.0))},
        vocab_size=d["vocab_size"], tie_word_embeddings=False, **extra)


@dataclass
class Qwen3TTSConfig:
    raw: dict
    talker: SimpleNamespace
    predictor: SimpleNamespace

    @classmethod
    def from_dict(cls, raw: dict) -> "Qwen3TTSConfig":
        t = raw["talker_config"]
        p = t.get("code_predictor_config") or {}
        talker = _decoder_config(t, text_vocab_size=t["text_vocab_size"], text_hidden_size=t["text_hidden_size"],
                                 num_code_groups=t["num_code_groups"])
        predictor = _decoder_config(p, num_code_groups=p.get("num_code_groups", t["num_code_groups"]))
        predictor.max_position_embeddings = predictor.num_code_groups      # one frame: positions 0..N-1
        return cls(raw, talker, predictor)

    @classmethod
    def from_folder(cls, folder: str | Path) -> "Qwen3TTSConfig":
        return cls.from_dict(json.loads((Path(folder) / "config.json").read_text()))

    def __getattr__(self, name):           # talker_config keys (codec ids, spk_id, ...), then the top level
        raw = self.__dict__.get("raw", {})
        for d in (raw.get("talker_config", {}), raw):
            if name in d:
                return d[name]
        raise AttributeError(name)

    @property
    def num_code_groups(self) -> int:
        return self.talker.num_code_groups


# --- talker ----------------------------------------------------------------------------------------
class ResizeMLP(nn.Module):
    """text_projection: linear_fc2(act(linear_fc1(x))), both with bias (the act is the config's, silu)."""

    def __init__(self, n_in: int, n_mid: int, n_out: int):
        super().__init__()
        self.linear_fc1 = nn.Linear(n_in, n_mid, bias=True)
        self.linear_fc2 = nn.Linear(n_mid, n_out, bias=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear_fc2(F.silu(self.linear_fc1(x)))


class TalkerModel(DecoderModel):
    """`talker.model`: Qwen3 layers + norm over input embeddings; the codec and text embeddings."""

    def __init__(self, config):
        super().__init__(config, lambda i, rotary: dense_layer(config, rotary, qk_norm=True))
        del self.embed_tokens                                   # inputs are embeddings
        self.codec_embedding = nn.Embedding(config.vocab_size, config.hidden_size)
        self.text_embedding = nn.Embedding(config.text_vocab_size, config.text_hidden_size)

    def forward(self, inputs_embeds: torch.Tensor, positions: torch.Tensor, ctx) -> torch.Tensor:
        x, residual = inputs_embeds, None
        for layer in self.layers:
            x, residual = layer(x, residual, positions, ctx)
        x, _ = self.norm(x, residual)
        return x


class PredictorModel(DecoderModel):
    """`talker.code_predictor.model`: Qwen3 layers + norm; codec_embedding.j embeds code j+1 (talker width)."""

    def __init__(self, config, embedding_dim: int):
        super().__init__(config, lambda i, rotary: dense_layer(config, rotary, qk_norm=True))
        self.config = config
        del self.embed_tokens
        for layer in self.layers:
            a = layer.self_attn
            a.attn = PredictorAttention(a.num_heads, a.num_kv_heads, a.head_dim, a.head_dim ** -0.5)
        self.codec_embedding = nn.ModuleList(nn.Embedding(config.vocab_size, embedding_dim)
                                             for _ in range(config.num_code_groups - 1))

    def forward(self, x: torch.Tensor, position: int) -> torch.Tensor:
        return predictor_step(self, x, position, self.config.num_code_groups)


class CodePredictor(nn.Module):
    """`talker.code_predictor`."""

    def __init__(self, config, talker_hidden: int):
        super().__init__()
        self.config = config
        self.model = PredictorModel(config, talker_hidden)
        self.lm_head = nn.ModuleList(nn.Linear(config.hidden_size, config.vocab_size, bias=False)
                                     for _ in range(config.num_code_groups - 1))
        self.small_to_mtp_projection = (nn.Linear(talker_hidden, config.hidden_size, bias=True)
                                        if config.hidden_size != talker_hidden else nn.Identity())

    def reserve(self, rows: int, device, dtype) -> None:
        """Static per-row caches for up to `rows` rows (call before capturing a CUDA graph)."""
        for layer in self.model.layers:
            a = layer.self_attn.attn
            if a.k_buf is None or a.k_buf.shape[0] < rows or a.k_buf.dtype != dtype or a.k_buf.device != device:
                shape = (rows, self.config.num_code_groups, a.num_kv_heads, a.head_dim)
                a.k_buf = torch.zeros(shape, dtype=dtype, device=device)
                a.v_buf = torch.zeros(shape, dtype=dtype, device=device)

    def step(self, x: torch.Tensor, position: int) -> torch.Tensor:
        """One input embedding per row (talker width) at `position` -> the predictor's hidden state."""
        return self.model(self.small_to_mtp_projection(x), position)


class Talker(nn.Module):
    """`talker`: model, text_projection, codec_head, code_predictor."""

    def __init__(self, config: Qwen3TTSConfig):
        super().__init__()
        t = config.talker
        self.model = TalkerModel(t)
        self.text_projection = ResizeMLP(t.text_hidden_size, t.text_hidden_size, t.hidden_size)
        self.codec_head = nn.Linear(t.hidden_size, t.vocab_size, bias=False)
        self.code_predictor = CodePredictor(config.predictor, t.hidden_size)


# --- the model ------------------------------------------------------------------------------------
@dataclass
class TalkerPrompt:
    """One request's talker inputs: prefill embeddings, then per decode step s the text stream's
    vector `trailing[s]` (s < len) or `pad` (the projected tts_pad) once the text is used up."""
    embeds: torch.Tensor        # [T, H]
    trailing: torch.Tensor      # [L, H]
    pad: torch.Tensor           # [H]
    repetition_penalty: float = 1.05    # on code-0 ids seen so far (the reference's default)

    def __len__(self) -> int:   # the engine's prompt length
        return self.embeds.shape[0]


class Qwen3TTS(nn.Module):
    """The release checkpoint's `talker.*` (its `speaker_encoder.*`, Base models only, is skipped:
    preset speakers are codec-embedding rows; a cloned voice's x-vector and reference codes come from
    python_backends/tts/qwen3_tts/clone.py and are passed to `build_prompt`)."""

    packed = PACKED
    skip_prefixes = ("speaker_encoder.",)

    def __init__(self, config: Qwen3TTSConfig):
        super().__init__()
        self.config = config
        self.talker = Talker(config)
        t = config.talker
        self.num_code_groups = t.num_code_groups
        self.codebook_size = config.predictor.vocab_size
        self._voice_rows: dict[tuple, tuple[torch.Tensor, ...]] = {}   # build_prompt's, per preset voice

    # -- engine interface ----------------------------------------------------------------------
    def forward(self, inputs_embeds: torch.Tensor, positions: torch.Tensor, ctx: ForwardContext) -> torch.Tensor:
        """Talker layers over packed embeddings [T, H] (prefill) or one per sequence (decode)."""
        return self.talker.model(inputs_embeds, positions, ctx)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.talker.codec_head(hidden)

    def codec_embed(self, ids: torch.Tensor) -> torch.Tensor:
        return self.talker.model.codec_embedding(ids)

    def text_embed(self, ids: torch.Tensor) -> torch.Tensor:
        """P(ids): text ids -> talker-width vectors."""
        return self.talker.text_projection(self.talker.model.text_embedding(ids))

    def embed_frame(self, codes: torch.Tensor, text: torch.Tensor | None = None) -> torch.Tensor:
        """codes [B, N] -> [B, H]: E0(code 0) + sum_j predictor E_j(code j+1) (+ the text vector [B, H]),
        summed in the reference's order."""
        parts = [self.codec_embed(codes[:, 0])]
        parts += [emb(codes[:, j + 1]) for j, emb in enumerate(self.talker.code_predictor.model.codec_embedding)]
        x = torch.stack(parts, dim=1).sum(1)
        return x if text is None else x + text

    @staticmethod
    def text_at(trailing: torch.Tensor, lengths: torch.Tensor, steps: torch.Tensor, pad: torch.Tensor) -> torch.Tensor:
        """The text stream's vector per row at decode step `steps` [B]: trailing [B, L, H] (rows padded),
        lengths [B], pad [H] (or [B, H]). Device-side gather, no host sync."""
        idx = steps.clamp(max=trailing.shape[1] - 1)
        picked = trailing[torch.arange(trailing.shape[0], device=trailing.device), idx]
        return torch.where((steps < lengths)[:, None], picked, pad.expand_as(picked))

    def reserve(self, rows: int, device=None, dtype=None) -> None:
        p = next(self.parameters())
        self.talker.code_predictor.reserve(rows, device or p.device, dtype or p.dtype)

    def predict_codes(self, hidden: torch.Tensor, code0: torch.Tensor, sampler: Sampler = greedy) -> torch.Tensor:
        """Codebooks 1..N-1 for every row: hidden [B, H] (the talker's last hidden state, the one whose
        logits gave code0), code0 [B] -> codes [B, N]. A fixed N-token pass per frame (N-1 sub-steps
        after the first token), all on the device; `sampler(logits, j)` picks code j+1."""
        cp = self.talker.code_predictor
        b = hidden.shape[0]
        self.reserve(b, hidden.device, hidden.dtype)
        cp.step(hidden, 0)
        x = self.codec_embed(code0)
        codes = [code0]
        for j in range(self.num_code_groups - 1):
            h = cp.step(x, j + 1)
            codes.append(sampler(cp.lm_head[j](h), j))
            if j + 1 < self.num_code_groups - 1:
                x = cp.model.codec_embedding[j](codes[-1])
        return torch.stack(codes, dim=1)

    # -- frame model for the AR engine (python_backends/ar/model_runner.FrameModel) --------------
    @property
    def num_codes(self) -> int:
        return self.num_code_groups

    def allocate_rows(self, rows: int, batch: int, max_steps: int) -> None:
        """Per-row state, indexed by the engine's row: the last frame (the next input), the text stream
        (cut at max_steps: no row decodes further), its length, the pad vector, the code-0 ids seen so
        far and the repetition penalty; the predictor's cache for `batch` rows (fixed before capture)."""
        w = self.talker.codec_head.weight
        h, dev = w.shape[1], w.device
        self.row_state = SimpleNamespace(
            frame=torch.zeros(rows, self.num_code_groups, dtype=torch.long, device=dev),
            text=torch.zeros(rows, max_steps, h, dtype=w.dtype, device=dev),
            text_len=torch.zeros(rows, dtype=torch.long, device=dev),
            pad=torch.zeros(rows, h, dtype=w.dtype, device=dev),
            seen=torch.zeros(rows, self.config.talker.vocab_size, dtype=torch.bool, device=dev),
            penalty=torch.ones(rows, device=dev))
        self.rules = TalkerRules(self)
        self.reserve(batch)

    def admit_row(self, row: int, prompt: TalkerPrompt) -> None:
        r = self.row_state
        n = min(prompt.trailing.shape[0], r.text.shape[1])
        r.text[row, :n] = prompt.trailing[:n]
        r.text_len[row] = n
        r.pad[row] = prompt.pad
        r.seen[row] = False
        r.penalty[row] = prompt.repetition_penalty

    def prefill_embeds(self, prompts: list[TalkerPrompt]) -> torch.Tensor:
        return torch.cat([p.embeds for p in prompts])

    def decode_embeds(self, rows: torch.Tensor, count: torch.Tensor) -> torch.Tensor:
        """embed_frame(last frame) + the text vector of step count-1 (`text_at`, gathered straight from
        the row table rather than copying each row's whole stream)."""
        r = self.row_state
        step = count - 1
        picked = r.text[rows, step.clamp(0, r.text.shape[1] - 1)]
        text = torch.where((step < r.text_len[rows])[:, None], picked, r.pad[rows])
        return self.embed_frame(r.frame[rows], text)

    def sample_frame(self, hidden: torch.Tensor, rows: torch.Tensor, count: torch.Tensor, pick) -> torch.Tensor:
        """generate_codes' step: rules -> code 0 -> predict_codes. Frame f's code j draws with step
        f*N + j, so a seeded request's frames depend on its seed alone, not on its batch."""
        r, n = self.row_state, self.num_code_groups
        logits = self.rules(self.compute_logits(hidden), r.seen[rows], count, r.penalty[rows])
        code0 = pick(logits, count * n)
        r.seen.index_put_((rows, code0), torch.ones_like(code0, dtype=torch.bool))   # no host scalar: capturable
        codes = self.predict_codes(hidden, code0, lambda lg, j: pick(lg, count * n + j + 1))
        r.frame[rows] = codes
        return codes

    def predictor_logits(self, hidden: torch.Tensor, codes: torch.Tensor) -> torch.Tensor:
        """Teacher-forced predictor logits for codebooks 1..N-1: hidden [B, H], codes [B, N] -> [B, N-1, V]."""
        cp = self.talker.code_predictor
        self.reserve(hidden.shape[0], hidden.device, hidden.dtype)
        cp.step(hidden, 0)
        x, out = self.codec_embed(codes[:, 0]), []
        for j in range(self.num_code_groups - 1):
            out.append(cp.lm_head[j](cp.step(x, j + 1)))
            if j + 1 < self.num_code_groups - 1:
                x = cp.model.codec_embedding[j](codes[:, j + 1])
        return torch.stack(out, dim=1)

    # -- the prompt ------------------------------------------------------------------------------
    def speakers(self) -> list[str]:
        return sorted((self.config.raw["talker_config"].get("spk_id") or {}).keys())

    def languages(self) -> list[str]:
        return languages(self.config.raw["talker_config"])

    def language_id(self, language: str, speaker: str | None) -> int | None:
        return language_id(self.config.raw["talker_config"], language, speaker)

    def speaker_embed(self, speaker: str) -> torch.Tensor:
        table = self.config.raw["talker_config"].get("spk_id") or {}
        if speaker.lower() not in table:
            raise ValueError(f"speaker {speaker!r} is not supported; supported: {self.speakers()}")
        ids = upload(table[speaker.lower()], self.talker.codec_head.weight.device).reshape(-1)
        return self.codec_embed(ids).reshape(-1)

    def _fixed_rows(self, language: str, speaker: str | None, speaker_embed: torch.Tensor | None):
        """What build_prompt's layout holds for a voice whatever the text: the projected tts_eos and
        tts_pad, the rows before the text (codec side [think..., speaker, pad] over the text side
        [tts_pad..., tts_bos]) and the codec bos row the first text row goes over."""
        c, dev = self.config, self.talker.codec_head.weight.device
        P, E = self.text_embed, self.codec_embed
        tts_bos, tts_eos, tts_pad = P(upload([c.tts_bos_token_id, c.tts_eos_token_id, c.tts_pad_token_id], dev)).unbind(0)
        lid = self.language_id(language, speaker)
        prefix = ([c.codec_nothink_id, c.codec_think_bos_id, c.codec_think_eos_id] if lid is None
                  else [c.codec_think_id, c.codec_think_bos_id, lid, c.codec_think_eos_id])
        codec = [E(upload(prefix, dev))]
        if speaker_embed is None and speaker:
            speaker_embed = self.speaker_embed(speaker)
        if speaker_embed is not None:
            codec.append(speaker_embed.reshape(1, -1).to(codec[0].dtype))
        codec.append(E(upload([c.codec_pad_id, c.codec_bos_id], dev)))
        codec = torch.cat(codec)                                               # [C, H]
        n = codec.shape[0]
        text_side = torch.cat([tts_pad.expand(n - 2, -1), tts_bos[None]])       # [C-1, H]
        return tts_eos, tts_pad, text_side + codec[:-1], codec[-1]

    @torch.no_grad()
    def build_prompt(self, input_ids: list[int] | torch.Tensor, language: str = "auto", speaker: str | None = None,
                     instruct_ids: list[int] | torch.Tensor | None = None, non_streaming_mode: bool = False,
                     speaker_embed: torch.Tensor | None = None, ref_codes: torch.Tensor | None = None,
                     ref_ids: list[int] | torch.Tensor | None = None) -> TalkerPrompt:
        """The reference's layout. `input_ids`: the tokens of
        f"<|im_start|>assistant\\n{text}<|im_end|>\\n<|im_start|>assistant\\n" (3 role tokens, the text,
        5 closing tokens); `instruct_ids`: of f"<|im_start|>user\\n{instruct}<|im_end|>\\n" (VoiceDesign,
        1.7B CustomVoice); `speaker`: a preset speaker (CustomVoice) or `speaker_embed` [H] (a voice
        clone's x-vector). Codec side: [think, think_bos, lang, think_eos] (or [nothink, think_bos,
        think_eos] for auto), speaker, pad, bos; text side: P(role), tts_pad..., tts_bos, text.
        Voice clone "ICL" mode: `ref_codes` [F, N] (the reference clip's frames) and `ref_ids` (the tokens
        of f"<|im_start|>assistant\\n{ref_text}<|im_end|>\\n": 3 role tokens, the transcript, 2 closing):
        after the codec pad, [bos, reference frames] on the codec side and the transcript then the text
        on the text side, so the talker continues the reference's speech."""
        dev = self.talker.codec_head.weight.device
        ids = upload(input_ids, dev).reshape(-1)
        P, E = self.text_embed, self.codec_embed
        key = (language, speaker)
        rows = self._voice_rows.get(key) if speaker_embed is None else None
        if rows is None:
            rows = self._fixed_rows(language, speaker, speaker_embed)
            if speaker_embed is None:       # a preset voice's rows are the same for every request
                self._voice_rows[key] = rows
        tts_eos, tts_pad, head, codec_bos = rows
        parts = []
        if instruct_ids is not None and len(instruct_ids):
            parts.append(P(upload(instruct_ids, dev).reshape(-1)))
        parts += [P(ids[:3]), head]
        if ref_codes is not None:       # ICL: text = transcript + text + eos over codec = bos + reference frames
            ref = upload(ref_ids, dev).reshape(-1)
            text = torch.cat([P(torch.cat([ref[3:-2], ids[3:-5]])), tts_eos[None]])
            frames = torch.cat([codec_bos[None], self.embed_frame(torch.as_tensor(ref_codes, device=dev).long())])
            if non_streaming_mode:
                parts += [text + E(torch.full((text.shape[0],), self.config.codec_pad_id, device=dev)),
                          frames + tts_pad]
                trailing = tts_pad[None]
            elif text.shape[0] > frames.shape[0]:     # the text outlasts the reference: the rest streams
                parts.append(text[:frames.shape[0]] + frames)
                trailing = text[frames.shape[0]:]
            else:
                parts.append(torch.cat([text, tts_pad.expand(frames.shape[0] - text.shape[0], -1)]) + frames)
                trailing = tts_pad[None]
        elif non_streaming_mode:          # the whole text first (over codec pads), then bos; decode adds pad
            text = torch.cat([P(ids[3:-5]), tts_eos[None]])
            parts += [text + E(torch.full((text.shape[0],), self.config.codec_pad_id, device=dev)),
                      (tts_pad + codec_bos)[None]]
            trailing = tts_pad[None]
        else:                           # the first text token with bos; the rest streams one per step
            parts.append(P(ids[3:4]) + codec_bos)
            trailing = torch.cat([P(ids[4:-5]), tts_eos[None]])
        return TalkerPrompt(torch.cat(parts), trailing, tts_pad)


def languages(talker_config: dict) -> list[str]:
    """The language names a checkpoint takes: auto and its language tags (a dialect comes with its speaker)."""
    ids = talker_config.get("codec_language_id") or {}
    return ["auto"] + sorted(k for k in ids if "dialect" not in k)


def language_id(talker_config: dict, language: str, speaker: str | None) -> int | None:
    """The codec id of the language tag (None for auto); a dialect speaker speaking Chinese (or auto)
    gets the dialect's tag, as the reference does."""
    lang = (language or "auto").lower()
    table = talker_config.get("codec_language_id") or {}
    if lang != "auto" and lang not in table:
        raise ValueError(f"language {language!r} is not supported; supported: {languages(talker_config)}")
    lid = None if lang == "auto" else table[lang]
    if lang in ("chinese", "auto") and speaker:
        dialect = (talker_config.get("spk_is_dialect") or {}).get(speaker.lower(), False)
        if dialect:
            lid = table[dialect]
    return lid


def assistant_text(text: str) -> str:
    return f"<|im_start|>assistant\n{text}<|im_end|>\n<|im_start|>assistant\n"


def instruct_text(instruct: str) -> str:
    return f"<|im_start|>user\n{instruct}<|im_end|>\n"


def reference_text(transcript: str) -> str:
    """What `ref_ids` tokenize: a voice clone reference clip's transcript."""
    return f"<|im_start|>assistant\n{transcript}<|im_end|>\n"


# --- the reference's logits processors for codebook 0 --------------------------------------------
class TalkerRules:
    """What the reference's talker `generate` applies to codebook-0 logits before sampling, device-side:
    repetition penalty over the code-0 ids generated so far (`seen` [B, V] bool), the control/speaker
    range [V-1024, V) suppressed except EOS, and EOS banned for the first `min_new_tokens` (2) steps."""

    def __init__(self, model: Qwen3TTS, min_new_tokens: int = 2):
        v = model.config.talker.vocab_size
        self.eos = model.config.codec_eos_token_id
        dev = model.talker.codec_head.weight.device
        self.suppress = torch.zeros(v, dtype=torch.bool, device=dev)
        self.suppress[v - 1024:] = True
        self.suppress[self.eos] = False
        self.min_new_tokens = min_new_tokens

    def __call__(self, logits: torch.Tensor, seen: torch.Tensor, steps: torch.Tensor,
                 repetition_penalty: torch.Tensor | float = 1.0) -> torch.Tensor:
        """logits [B, V] (fp32), seen [B, V], steps [B] (code-0 ids sampled before this one)."""
        logits = logits.float()
        pen = torch.as_tensor(repetition_penalty, dtype=logits.dtype, device=logits.device).reshape(-1, 1)
        logits = torch.where(seen, torch.where(logits < 0, logits * pen, logits / pen), logits)
        logits = logits.masked_fill(self.suppress, float("-inf"))
        early = (steps < self.min_new_tokens)[:, None] & (torch.arange(logits.shape[1], device=logits.device) == self.eos)
        return logits.masked_fill(early, float("-inf"))


class SubtalkerSampler:
    """Temperature / top-k / top-p sampling for the predictor's codes with the engine's counter-based
    sampler (triton_omni.ar.sampling.sample); sub-step j of frame f draws with step f*N + j."""

    def __init__(self, temperature: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor, seeds: torch.Tensor,
                 frames: torch.Tensor, num_code_groups: int):
        self.t, self.k, self.p, self.seeds, self.frames, self.n = temperature, top_k, top_p, seeds, frames, num_code_groups

    def __call__(self, logits: torch.Tensor, j: int) -> torch.Tensor:
        from triton_omni.ar.sampling import sample

        return sample(logits, self.t, self.k, self.p, self.seeds, self.frames * self.n + j, True, True)


def talker_engine(model: Qwen3TTS, config, device=None, dtype=None):
    """The AR engine over this talker: prompts are `TalkerPrompt`s, outputs frames; codec EOS stops."""
    from triton_omni.ar.engine import LLMEngine

    p = next(model.parameters())
    return LLMEngine(model, config, device or p.device, dtype or p.dtype,
                     eos_token_ids=[model.config.codec_eos_token_id], vocab_size=model.config.talker.vocab_size)


# --- loading ---------------------------------------------------------------------------------------
def load_qwen3_tts(folder: str | Path, device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32) -> Qwen3TTS:
    config = Qwen3TTSConfig.from_folder(folder)
    with torch.device(device):
        model = Qwen3TTS(config)
    load_weights(model, folder)
    for p in model.parameters():
        p.data = p.data.to(dtype)
    return model.eval()
