"""Fish Audio S2-Pro's dual-AR talker, loaded from the release folder (config.json with
`model_type: fish_qwen3_omni`, model.safetensors with `text_model.model.*` and `audio_decoder.*`, a
Hugging Face tokenizer with `<|semantic:i|>` tokens; the codec, codec.pth, is codec.py's).

The model speaks in frames of the codec (~21.5 Hz at 44.1 kHz): N codes per frame (10 in the release:
one semantic codebook, then residual ones).

  slow AR   a Qwen3-style decoder (q/k norm, GQA, SwiGLU) over the text and audio stream. A position's
            input is embed(main id), plus, where the main id is a semantic token, the sum of the
            frame's N codebook embeddings (one table, codebook i at offset i * codebook_size), the
            whole divided by sqrt(N + 1). Its logits (tied to the embedding unless the config says not)
            choose the next main id: a semantic token (code 0 = id - semantic_begin) or <|im_end|>.
  fast AR   a small decoder run per frame over [project_in(h), E(code 0), ..., E(code N-2)] (h: the
            slow model's final-norm output); position j's head gives code j. One embedding table and
            one head for every codebook; it starts from an empty cache every frame.

The release rotates q/k pairs (2i, 2i+1) with cos/sin tables stored in bfloat16. Our layers rotate
halves (i, i + D/2), so q/k projection rows (and q/k norm weights) are permuted per head at load time,
and the rope tables are rounded to bfloat16 as the release's are: the same maths, on the engine's
paged-cache layers and kernels.

A frame, as the engine sees it, is N + 1 ids: [main id, code 0, ..., code N-1]; the main id is what
EOS (<|im_end|>) is checked against. Sampling follows the release's decode loop: top-k and top-p
chosen on the raw logits (the token that crosses top_p is dropped too, the best one always kept),
then temperature; the main id is restricted to semantic tokens and <|im_end|>; "repetition aware
sampling" redraws the main id at temperature 1.0 / top-p 0.9 when it repeats one of the last 10 main
ids (of the frames after the first). The engine's counter-based sampler draws everything: frame f's
k-th draw uses step f * (N + 1) + k, so a seeded request's audio depends on its seed alone.
"""
from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

import torch
from torch import nn

from triton_omni.models.context import ForwardContext
from triton_omni.models.decoder import DecoderModel, dense_layer
from triton_omni.models.loader import checkpoint_tensors
from triton_omni.tts.code_predictor import PredictorAttention, predictor_step

IM_END = "<|im_end|>"
SEMANTIC = "<|semantic:{}|>"
RAS_WINDOW, RAS_TEMPERATURE, RAS_TOP_P = 10, 1.0, 0.9     # the release's repetition aware sampling
# the release's generate defaults (tools' CLI and generate_long)
DEFAULT_SAMPLING = {"temperature": 1.0, "top_p": 0.9, "top_k": 30}


# --- config ------------------------------------------------------------------------------------------
def _decoder_config(d: dict, vocab: int, max_positions: int) -> SimpleNamespace:
    """Our decoder blocks' config from a text_config / audio_decoder_config dict."""
    if bool(d.get("attention_qkv_bias", False)) != bool(d.get("attention_o_bias", False)):
        raise NotImplementedError("attention_qkv_bias != attention_o_bias is not supported")
    heads = d["n_head"]
    kv = d.get("n_local_heads") or -1
    return SimpleNamespace(
        hidden_size=d["dim"], intermediate_size=d["intermediate_size"], num_hidden_layers=d["n_layer"],
        num_attention_heads=heads, num_key_value_heads=heads if kv == -1 else kv,
        head_dim=d.get("head_dim") or d["dim"] // heads, rms_norm_eps=d.get("norm_eps", 1e-5),
        attention_bias=bool(d.get("attention_qkv_bias", False)), mlp_bias=False,
        max_position_embeddings=max_positions,
        rope_parameters={"rope_type": "default", "rope_theta": float(d.get("rope_base", 10000))},
        vocab_size=vocab, tie_word_embeddings=d.get("tie_word_embeddings", True),
        qk_norm=bool(d.get("attention_qk_norm", False)))


@dataclass
class FishConfig:
    slow: SimpleNamespace
    fast: SimpleNamespace
    num_codebooks: int
    codebook_size: int
    semantic_begin: int
    semantic_end: int
    im_end: int
    raw: dict

    @classmethod
    def from_folder(cls, folder: str | Path, tokenizer=None) -> "FishConfig":
        raw = json.loads((Path(folder) / "config.json").read_text())
        if raw.get("model_type") != "fish_qwen3_omni":
            raise ValueError(f"{folder}: model_type {raw.get('model_type')!r}; expected 'fish_qwen3_omni' (S2-Pro)")
        t, a = raw["text_config"], dict(raw["audio_decoder_config"])
        for key in ("dim", "n_head", "n_local_heads", "head_dim", "intermediate_size", "attention_qk_norm",
                    "attention_qkv_bias", "attention_o_bias", "norm_eps", "rope_base"):
            if a.get(key) is None and key in t:            # the release falls back to the slow model's
                a[key] = t[key]
        n = a["num_codebooks"]
        begin, end = raw.get("semantic_start_token_id", 0), raw.get("semantic_end_token_id", 0)
        im_end = raw.get("im_end_token_id")
        if tokenizer is not None:       # the release takes the semantic range from the tokenizer
            vocab = tokenizer.get_vocab()
            ids = [vocab[SEMANTIC.format(i)] for i in range(4096) if SEMANTIC.format(i) in vocab]
            if ids:
                begin, end = min(ids), max(ids)
            im_end = vocab[IM_END]
        return cls(_decoder_config(t, t["vocab_size"], t.get("max_seq_len", 4096)),
                   _decoder_config({**a, "tie_word_embeddings": False}, a["vocab_size"], n),
                   n, a["vocab_size"], begin, end, im_end, raw)


# --- layers ------------------------------------------------------------------------------------------
def _round_rope_bf16(model: DecoderModel) -> None:
    """The release keeps its cos/sin tables in bfloat16 (applied in fp32)."""
    r = model.rotary
    r.cos = r.cos.bfloat16().float()
    r.sin = r.sin.bfloat16().float()


class SlowModel(DecoderModel):
    """The slow AR over input embeddings (the engine's paged attention, kernels and graphs apply)."""

    def __init__(self, config):
        super().__init__(config, lambda i, rotary: dense_layer(config, rotary, config.qk_norm))
        _round_rope_bf16(self)

    def forward(self, inputs_embeds: torch.Tensor, positions: torch.Tensor, ctx) -> torch.Tensor:
        x, residual = inputs_embeds, None
        for layer in self.layers:
            x, residual = layer(x, residual, positions, ctx)
        x, _ = self.norm(x, residual)
        return x


class FastModel(DecoderModel):
    """The fast AR: one token per row per call at position p of a dense per-row cache of N slots
    (tts/code_predictor.PredictorAttention: no cache_spec, so the engine neither binds nor sizes it)."""

    def __init__(self, config):
        super().__init__(config, lambda i, rotary: dense_layer(config, rotary, config.qk_norm))
        _round_rope_bf16(self)
        self.config = config
        self.num_slots = config.max_position_embeddings
        for layer in self.layers:
            a = layer.self_attn
            a.attn = PredictorAttention(a.num_heads, a.num_kv_heads, a.head_dim, a.head_dim ** -0.5)

    def reserve(self, rows: int, device, dtype) -> None:
        for layer in self.layers:
            a = layer.self_attn.attn
            if a.k_buf is None or a.k_buf.shape[0] < rows or a.k_buf.dtype != dtype or a.k_buf.device != device:
                shape = (rows, self.num_slots, a.num_kv_heads, a.head_dim)
                a.k_buf = torch.zeros(shape, dtype=dtype, device=device)
                a.v_buf = torch.zeros(shape, dtype=dtype, device=device)

    def forward(self, x: torch.Tensor, position: int) -> torch.Tensor:
        return predictor_step(self, x, position, self.num_slots)


def filter_logits(logits: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """The release's top-k / top-p, on raw logits [B, V] (before temperature): a token goes when its
    rank >= top_k or the cumulative probability up to and including it exceeds top_p; the best stays.
    top_k [B] (<= 0: off), top_p [B]."""
    sorted_x, order = logits.sort(-1, descending=True)
    cum = sorted_x.softmax(-1).cumsum(-1)
    ranks = torch.arange(logits.shape[-1], device=logits.device)[None, :]
    k = torch.where(top_k > 0, top_k, logits.shape[-1])
    drop = (cum > top_p[:, None]) | (ranks >= k[:, None])
    drop[:, 0] = False
    return logits.masked_fill(torch.empty_like(drop).scatter_(-1, order, drop), float("-inf"))


# --- the model ---------------------------------------------------------------------------------------
@dataclass
class FishPrompt:
    """One request's prompt: ids [T, N + 1] (main id, then N codes: zero on text positions) and its
    sampling settings (temperature for the repetition-aware redraw; the engine applies its own)."""
    ids: torch.Tensor
    temperature: float = 1.0
    top_p: float = 0.9
    top_k: int = 30

    def __len__(self) -> int:
        return self.ids.shape[0]


class FishS2(nn.Module):
    def __init__(self, config: FishConfig):
        super().__init__()
        self.config = config
        s, f = config.slow, config.fast
        self.slow = SlowModel(s)
        del self.slow.embed_tokens
        self.embeddings = nn.Embedding(s.vocab_size, s.hidden_size)
        self.codebook_embeddings = nn.Embedding(config.codebook_size * config.num_codebooks, s.hidden_size)
        self.output = None if s.tie_word_embeddings else nn.Linear(s.hidden_size, s.vocab_size, bias=False)
        self.fast = FastModel(f)
        del self.fast.embed_tokens
        self.fast_embeddings = nn.Embedding(config.codebook_size, f.hidden_size)
        self.fast_project_in = (nn.Linear(s.hidden_size, f.hidden_size) if f.hidden_size != s.hidden_size
                                else nn.Identity())
        self.fast_output = nn.Linear(f.hidden_size, config.codebook_size, bias=False)
        self.num_codebooks = config.num_codebooks
        self.num_codes = config.num_codebooks + 1           # the engine's frame: main id + N codes

    # -- the slow model ---------------------------------------------------------------------------
    def forward(self, inputs_embeds: torch.Tensor, positions: torch.Tensor, ctx: ForwardContext) -> torch.Tensor:
        return self.slow(inputs_embeds, positions, ctx)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.output(hidden) if self.output is not None else hidden @ self.embeddings.weight.T

    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        """ids [T, N + 1] -> input embeddings [T, H], summed and scaled in the release's order."""
        c = self.config
        offsets = torch.arange(c.num_codebooks, device=ids.device) * c.codebook_size
        codes = self.codebook_embeddings(ids[:, 1:] + offsets).sum(1)
        semantic = (ids[:, 0] >= c.semantic_begin) & (ids[:, 0] <= c.semantic_end)
        x = self.embeddings(ids[:, 0]) + torch.where(semantic[:, None], codes, torch.zeros_like(codes))
        return torch.where(semantic[:, None], x / math.sqrt(c.num_codebooks + 1), x)

    def main_bias(self, device) -> torch.Tensor:
        """0 on semantic tokens and <|im_end|>, -inf elsewhere: what the main id may be."""
        c = self.config
        bias = torch.full((c.slow.vocab_size,), float("-inf"), device=device)
        bias[c.semantic_begin:c.semantic_end + 1] = 0.0
        bias[c.im_end] = 0.0
        return bias

    # -- the fast model ---------------------------------------------------------------------------
    def reserve(self, rows: int, device=None, dtype=None) -> None:
        p = self.fast_output.weight
        self.fast.reserve(rows, device or p.device, dtype or p.dtype)

    def fast_logits(self, hidden: torch.Tensor, codes: torch.Tensor) -> torch.Tensor:
        """Teacher-forced fast logits for codes 1..N-1: hidden [B, H] (slow final norm), codes [B, N]
        -> [B, N-1, codebook_size]."""
        self.reserve(hidden.shape[0], hidden.device, hidden.dtype)
        self.fast(self.fast_project_in(hidden), 0)
        out = []
        for j in range(1, self.num_codebooks):
            out.append(self.fast_output(self.fast(self.fast_embeddings(codes[:, j - 1]), j)))
        return torch.stack(out, dim=1)

    def sample_codes(self, hidden: torch.Tensor, code0: torch.Tensor, pick) -> torch.Tensor:
        """Codes 1..N-1 per row; `pick(logits, j)` draws code j. -> codes [B, N]."""
        self.reserve(hidden.shape[0], hidden.device, hidden.dtype)
        self.fast(self.fast_project_in(hidden), 0)
        codes = [code0]
        for j in range(1, self.num_codebooks):
            h = self.fast(self.fast_embeddings(codes[-1]), j)
            codes.append(pick(self.fast_output(h).float(), j))
        return torch.stack(codes, dim=1)

    # -- frame model for the AR engine (python_backends/ar/model_runner.FrameModel) ----------------
    def allocate_rows(self, rows: int, batch: int, max_steps: int) -> None:
        dev = self.embeddings.weight.device
        self.row_state = SimpleNamespace(
            frame=torch.zeros(rows, self.num_codes, dtype=torch.long, device=dev),
            window=torch.zeros(rows, RAS_WINDOW, dtype=torch.long, device=dev),
            temperature=torch.ones(rows, device=dev),
            top_p=torch.ones(rows, device=dev),
            top_k=torch.zeros(rows, dtype=torch.long, device=dev))
        self.bias = self.main_bias(dev)
        self.reserve(batch)

    def admit_row(self, row: int, prompt: FishPrompt) -> None:
        r = self.row_state
        r.window[row] = 0
        r.temperature[row] = prompt.temperature
        r.top_p[row] = prompt.top_p
        r.top_k[row] = prompt.top_k

    def prefill_embeds(self, prompts: list[FishPrompt]) -> torch.Tensor:
        dev = self.embeddings.weight.device
        return self.embed(torch.cat([p.ids.to(dev) for p in prompts]).long())

    def decode_embeds(self, rows: torch.Tensor, count: torch.Tensor) -> torch.Tensor:
        return self.embed(self.row_state.frame[rows])

    def sample_frame(self, hidden: torch.Tensor, rows: torch.Tensor, count: torch.Tensor, pick) -> torch.Tensor:
        """One frame per row: the main id (with the repetition-aware redraw), then the fast AR's codes."""
        r, c, k = self.row_state, self.config, self.num_codes
        step = count * k
        top_k, top_p, temp = r.top_k[rows], r.top_p[rows], r.temperature[rows]
        logits = self.compute_logits(hidden).float() + self.bias
        main = pick(filter_logits(logits, top_k, top_p), step)
        # the redraw at temperature 1: pick divides by the row's temperature, so scale by it first
        high = filter_logits(logits, top_k, torch.full_like(top_p, RAS_TOP_P)) / RAS_TEMPERATURE
        redraw = pick(high * temp.clamp(min=1e-5)[:, None], step + 1)
        window = r.window[rows]
        semantic = (main >= c.semantic_begin) & (main <= c.semantic_end)
        repeats = (window == main[:, None]).any(1) & semantic & (count > 0)
        main = torch.where(repeats, redraw, main)
        # the release's window holds the main ids of the frames after the first
        r.window[rows] = torch.where((count > 0)[:, None], torch.cat([window[:, 1:], main[:, None]], 1), window)
        code0 = (main - c.semantic_begin).clamp(0, c.codebook_size - 1)
        codes = self.sample_codes(hidden, code0, lambda lg, j: pick(filter_logits(lg, top_k, top_p), step + 1 + j))
        frame = torch.cat([main[:, None], codes], dim=1)
        r.frame[rows] = frame
        return frame


# --- loading -------------------------------------------------------------------------------------------
def _half_rotation(w: torch.Tensor, heads: int, head_dim: int) -> torch.Tensor:
    """Rows of a q or k projection (or a q/k norm weight) from pair-interleaved to half-split rope order."""
    perm = torch.cat([torch.arange(0, head_dim, 2), torch.arange(1, head_dim, 2)])
    return w.reshape(heads, head_dim, *w.shape[1:])[:, perm].reshape(w.shape)


def _load_layer(layer, rest: str, tensor: torch.Tensor, cfg) -> None:
    a, hd = layer.self_attn, cfg.head_dim
    if rest.startswith("attention.wqkv."):
        q, k, v = tensor.split([cfg.num_attention_heads * hd, cfg.num_key_value_heads * hd,
                                cfg.num_key_value_heads * hd])
        which = rest.rsplit(".", 1)[1]
        q, k = _half_rotation(q, cfg.num_attention_heads, hd), _half_rotation(k, cfg.num_key_value_heads, hd)
        getattr(a.qkv_proj, which).data.copy_(torch.cat([q, k, v]))
        return
    if rest in ("attention.q_norm.weight", "attention.k_norm.weight"):
        norm = a.q_norm if rest.startswith("attention.q") else a.k_norm
        norm.weight.data.copy_(_half_rotation(tensor, 1, hd))
        return
    if rest in ("feed_forward.w1.weight", "feed_forward.w3.weight"):
        layer.mlp.gate_up_proj.load_part(0 if "w1" in rest else 1, tensor)
        return
    target = {"attention.wo.weight": a.o_proj.weight, "attention.wo.bias": getattr(a.o_proj, "bias", None),
              "feed_forward.w2.weight": layer.mlp.down_proj.weight,
              "attention_norm.weight": layer.input_layernorm.weight,
              "ffn_norm.weight": layer.post_attention_layernorm.weight}.get(rest)
    if target is None:
        raise KeyError(rest)
    target.data.copy_(tensor)


def load_fish(folder: str | Path, device="cpu", dtype: torch.dtype = torch.float32, tokenizer=None) -> FishS2:
    from triton_omni.text.tokenizer import load_tokenizer

    tokenizer = tokenizer or load_tokenizer(folder)
    config = FishConfig.from_folder(folder, tokenizer)
    with torch.device(device):
        model = FishS2(config)
    plain = {"text_model.model.embeddings.weight": model.embeddings.weight,
             "text_model.model.norm.weight": model.slow.norm.weight,
             "audio_decoder.codebook_embeddings.weight": model.codebook_embeddings.weight,
             "audio_decoder.embeddings.weight": model.fast_embeddings.weight,
             "audio_decoder.norm.weight": model.fast.norm.weight,
             "audio_decoder.output.weight": model.fast_output.weight}
    if model.output is not None:
        plain["text_model.model.output.weight"] = model.output.weight
    if isinstance(model.fast_project_in, nn.Linear):
        plain["audio_decoder.project_in.weight"] = model.fast_project_in.weight
        plain["audio_decoder.project_in.bias"] = model.fast_project_in.bias
    seen = set()
    with torch.no_grad():
        for name, tensor in checkpoint_tensors(folder):
            seen.add(name)
            if name in plain:
                if plain[name].shape != tensor.shape:
                    raise ValueError(f"{name}: checkpoint shape {tuple(tensor.shape)} != {tuple(plain[name].shape)}")
                plain[name].data.copy_(tensor)
                continue
            for prefix, part, cfg in (("text_model.model.layers.", model.slow, config.slow),
                                      ("audio_decoder.layers.", model.fast, config.fast)):
                if name.startswith(prefix):
                    index, rest = name[len(prefix):].split(".", 1)
                    try:
                        _load_layer(part.layers[int(index)], rest, tensor.to(device), cfg)
                    except (KeyError, IndexError):
                        raise KeyError(f"{folder}: checkpoint tensor {name!r} has no place in FishS2") from None
                    break
            else:
                raise KeyError(f"{folder}: checkpoint tensor {name!r} has no place in FishS2")
    missing = [n for n in plain if n not in seen]
    for prefix, n in (("text_model.model.layers.", config.slow.num_hidden_layers),
                      ("audio_decoder.layers.", config.fast.num_hidden_layers)):
        missing += [f"{prefix}{i}.attention.wqkv.weight" for i in range(n)
                    if f"{prefix}{i}.attention.wqkv.weight" not in seen]
    if missing:
        raise KeyError(f"{folder}: checkpoint lacks {missing[:5]}")
    for p in model.parameters():
        p.data = p.data.to(dtype)
    return model.eval()


def fish_engine(model: FishS2, config, device=None, dtype=None):
    """The AR engine over the slow model; frames of N + 1 ids; <|im_end|> as the main id stops."""
    from triton_omni.ar.engine import LLMEngine

    p = next(model.parameters())
    return LLMEngine(model, config, device or p.device, dtype or p.dtype,
                     eos_token_ids=[model.config.im_end], vocab_size=model.config.slow.vocab_size)


# --- the prompt ----------------------------------------------------------------------------------------
SYSTEM = "convert the provided text to speech"
# with a reference voice: the system turn holds the clip's transcript, then its codes
REFERENCE_HEAD, REFERENCE_SPEECH = SYSTEM + " reference to the following:\n\nText:\n", "\n\nSpeech:\n"
SPEAKER_TAG = re.compile(r"<\|speaker:\d+\|>")


def prompt_pieces(text: str, reference_text: str | None = None, reference_codes=None) -> list:
    """The release's conversation for one text, piece by piece: strings (each tokenized alone, as the
    release encodes each part of its conversation alone) and, for a reference voice, its codes [N, F]
    after its transcript (which gets the release's `<|speaker:0|>` tag unless it has a speaker tag)."""
    system = [SYSTEM]
    if reference_codes is not None:
        tagged = reference_text if SPEAKER_TAG.search(reference_text) else "<|speaker:0|>" + reference_text
        system = [REFERENCE_HEAD, tagged, REFERENCE_SPEECH, reference_codes]
    return ["<|im_start|>system\n", *system, "<|im_end|>\n", "<|im_start|>user\n", text, "<|im_end|>\n",
            "<|im_start|>assistant\n<|voice|>"]


def prompt_ids(tokenizer, text: str, num_codebooks: int, reference: tuple[str, torch.Tensor] | None = None,
               semantic_begin: int = 0) -> torch.Tensor:
    """The prompt as the slow model's ids [T, N + 1]: text positions carry no codes; a reference
    (transcript, codes [N, F]) puts its frames in the system turn, each as main id semantic_begin +
    code 0 with its N codes."""
    rows = []
    for piece in prompt_pieces(text, *(reference or (None, None))):
        if isinstance(piece, str):
            ids = torch.tensor(tokenizer.encode(piece, add_special_tokens=False), dtype=torch.long)
            rows.append(torch.cat([ids[:, None], torch.zeros(len(ids), num_codebooks, dtype=torch.long)], 1))
        else:
            codes = torch.as_tensor(piece, dtype=torch.long).reshape(num_codebooks, -1).T
            rows.append(torch.cat([codes[:, :1] + semantic_begin, codes], 1))
    return torch.cat(rows)
