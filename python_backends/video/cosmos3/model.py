"""Cosmos3's transformer split in its two pathways, batched, on diffusers' own modules.

`Cosmos3OmniTransformer` is a mixture of transformers over one joint sequence: the prompt's tokens
(the "understanding" pathway: its own projections, causal attention over the text alone) and the
video's latent patches (the "generation" pathway: full attention over the text's keys and values
and its own). The text never attends to the video, so every layer's text keys and values are the
same at every denoising step and in every CFG branch of a prompt. The pipeline recomputes them per
step and branch; here the text encoder step computes them once (`text_kv`) and the denoise step
runs only the generation pathway against them (`denoise_rows`), several rows (clips x branches) in
one call, each with its own text length (padding keys masked), timestep and positions.

The maths is the processor's (`Cosmos3AttnProcessor`) and the decoder layer's, op for op; the
pipeline's and the model's packing functions (patchify, unpatchify, mRoPE ids) are called as they are.
"""
from __future__ import annotations

import torch
from diffusers.models.attention_dispatch import dispatch_attention_fn
from diffusers.pipelines.cosmos.pipeline_cosmos3_omni import get_3d_mrope_ids_vae_tokens

from triton_omni.runtime.device import upload

# the modules each half runs (the other half's are dropped from the step that does not run them)
TEXT_LAYER_PARTS = ("input_layernorm", "post_attention_layernorm", "mlp")
TEXT_ATTN_PARTS = ("to_q", "to_k", "to_v", "to_out", "norm_q", "norm_k", "k_norm_und_for_gen")
GEN_LAYER_PARTS = ("input_layernorm_moe_gen", "post_attention_layernorm_moe_gen", "mlp_moe_gen")
GEN_ATTN_PARTS = ("add_q_proj", "add_k_proj", "add_v_proj", "to_add_out", "norm_added_q", "norm_added_k")


def keep_half(transformer, half: str) -> None:
    """Drop the modules of the pathway this step never runs ("text": keep the understanding one)."""
    layer_parts, attn_parts = (GEN_LAYER_PARTS, GEN_ATTN_PARTS) if half == "text" else \
        (TEXT_LAYER_PARTS, TEXT_ATTN_PARTS)
    for layer in transformer.layers:
        for name in layer_parts:
            setattr(layer, name, None)
        for name in attn_parts:
            setattr(layer.self_attn, name, None)
    top = ("proj_in", "proj_out", "time_embedder", "norm_moe_gen", "norm", "lm_head") if half == "text" else \
        ("embed_tokens", "lm_head", "norm")
    for name in top:
        setattr(transformer, name, None)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def _rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    return x * cos + _rotate_half(x) * sin


def rotary(transformer, position_ids: torch.Tensor, dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """[3, N] mRoPE ids -> cos, sin [N, head_dim] (elementwise per position, as the model computes them
    for the whole joint sequence)."""
    cos, sin = transformer.rotary_emb(position_ids=position_ids.unsqueeze(1), device=position_ids.device, dtype=dtype)
    return cos.squeeze(0), sin.squeeze(0)


def _attend(attn, q, k, v, mask=None, causal=False) -> torch.Tensor:
    """[B, S, heads, hd] attention with the key / value heads repeated to the query heads (the grouping
    SDPA's enable_gqa applies: query head h reads key head h // groups), so every attention backend,
    masked or not, can run it (not all of them take grouped heads)."""
    groups = attn.num_attention_heads // attn.num_key_value_heads
    if groups > 1:
        k, v = k.repeat_interleave(groups, dim=2), v.repeat_interleave(groups, dim=2)
    return dispatch_attention_fn(q, k, v, attn_mask=mask, is_causal=causal, backend=attn.processor._attention_backend)


def kv_width(config) -> int:
    """Values a text token carries to the denoise step: every layer's key and value."""
    return config.num_hidden_layers * 2 * config.num_key_value_heads * config.head_dim


@torch.no_grad()
def text_kv(transformer, ids: torch.Tensor, lengths: list[int]) -> list[torch.Tensor]:
    """Token ids [B, L] (right-padded; each row's first `lengths[r]` are real) -> per row the text's keys
    (after norm, k_norm_und_for_gen and rotary) and values of every layer, [tokens, layers x 2 x KV x hd].
    Causal attention: a row's real tokens never see the padding after them."""
    cfg = transformer.config
    b, length = ids.shape
    h = transformer.embed_tokens(ids)                                       # [B, L, D]
    positions = torch.arange(length, dtype=torch.float32 if cfg.enable_fps_modulation else torch.long,
                             device=ids.device)
    cos, sin = rotary(transformer, positions[None].expand(3, -1), h.dtype)
    cos, sin = cos[None, :, None], sin[None, :, None]                       # [1, L, 1, hd]
    out = []
    for i, layer in enumerate(transformer.layers):
        attn = layer.self_attn
        x = layer.input_layernorm(h)
        q = attn.norm_q(attn.to_q(x).view(b, length, attn.num_attention_heads, attn.head_dim))
        k = attn.norm_k(attn.to_k(x).view(b, length, attn.num_key_value_heads, attn.head_dim))
        v = attn.to_v(x).view(b, length, attn.num_key_value_heads, attn.head_dim)
        k_gen = attn.k_norm_und_for_gen(k) if attn.k_norm_und_for_gen is not None else k
        out.append(torch.stack([_rope(k_gen, cos, sin), v], dim=2))        # [B, L, 2, KV, hd]
        if i == len(transformer.layers) - 1:
            break                        # the last layer's text output feeds nothing the video reads
        a = _attend(attn, _rope(q, cos, sin), _rope(k, cos, sin), v, causal=True)
        h = h + attn.to_out(a.flatten(-2, -1))
        h = h + layer.mlp(layer.post_attention_layernorm(h))
    kv = torch.stack(out, dim=2).flatten(2)                                 # [B, L, layers x 2 x KV x hd]
    return [kv[r, :n] for r, n in enumerate(lengths)]


def gen_positions(transformer, text_len: int, latent_shape: tuple[int, int, int], fps: float,
                  temporal: int) -> torch.Tensor:
    """The video tokens' [3, N] mRoPE ids after a prompt of `text_len` tokens, as the pipeline's
    `_prepare_vision_segment` makes them (fps modulation, the modality margin)."""
    cfg = transformer.config
    t, h, w = latent_shape
    p = cfg.latent_patch_size
    ids, _ = get_3d_mrope_ids_vae_tokens(
        grid_t=t, grid_h=-(-h // p), grid_w=-(-w // p),
        temporal_offset=text_len + cfg.unified_3d_mrope_temporal_modality_margin,
        reset_spatial_indices=cfg.unified_3d_mrope_reset_spatial_ids,
        fps=float(fps) if cfg.enable_fps_modulation else None, base_fps=float(cfg.base_fps),
        temporal_compression_factor=temporal)
    return ids


@torch.no_grad()
def denoise_rows(transformer, latents: list[torch.Tensor], timesteps: list[float], kv: list[torch.Tensor],
                 rope: list[tuple[torch.Tensor, torch.Tensor]]) -> list[torch.Tensor]:
    """One velocity prediction per row, in one call: row r's latents [1, C, T, h, w] (one shape for all
    rows), its timestep, its text keys / values [L_r, layers x 2 x KV x hd] and its video tokens'
    rotary (cos, sin [N, hd]). Returns [1, C, T, h, w] per row in the model's dtype (every frame noisy:
    text to video)."""
    cfg = transformer.config
    dtype = transformer.proj_in.weight.dtype
    packed, shapes = zip(*(transformer._patchify_and_pack_latents([x.to(dtype)]) for x in latents))
    x = transformer.proj_in(torch.stack(packed))                             # [B, N, D]
    b, n, _ = x.shape
    # the host's timesteps uploaded without waiting for the device (the loop runs a round ahead of it)
    t_in = upload(timesteps, x.device, torch.float32).view(b, 1) * cfg.timestep_scale
    temb_dtype = next(transformer.time_embedder.parameters()).dtype
    temb = transformer.time_embedder(transformer.time_proj(t_in.flatten()).to(temb_dtype)).to(dtype)
    h = x + temb[:, None]                                     # every token noisy: the pipeline's scatter_add
    cos = torch.stack([c for c, _ in rope])[:, :, None]                    # [B, N, 1, hd]
    sin = torch.stack([s for _, s in rope])[:, :, None]
    # text keys / values padded to the longest row; padding keys masked out of the softmax
    longest = max(k.shape[0] for k in kv)
    layers, kvh, hd = cfg.num_hidden_layers, cfg.num_key_value_heads, cfg.head_dim
    text = torch.zeros((b, longest, layers, 2, kvh, hd), dtype=dtype, device=x.device)
    for r, k in enumerate(kv):
        text[r, :k.shape[0]] = k.to(dtype).view(-1, layers, 2, kvh, hd)
    mask = None
    if any(k.shape[0] != longest for k in kv):
        keep = torch.ones((b, longest + n), dtype=torch.bool, device=x.device)
        for r, k in enumerate(kv):
            keep[r, k.shape[0]:longest] = False
        mask = keep[:, None, None, :]
    for i, layer in enumerate(transformer.layers):
        attn = layer.self_attn
        y = layer.input_layernorm_moe_gen(h)
        q = attn.norm_added_q(attn.add_q_proj(y).view(b, n, attn.num_attention_heads, attn.head_dim))
        k = attn.norm_added_k(attn.add_k_proj(y).view(b, n, attn.num_key_value_heads, attn.head_dim))
        v = attn.add_v_proj(y).view(b, n, attn.num_key_value_heads, attn.head_dim)
        all_k = torch.cat([text[:, :, i, 0], _rope(k, cos, sin)], dim=1)
        all_v = torch.cat([text[:, :, i, 1], v], dim=1)
        a = _attend(attn, _rope(q, cos, sin), all_k, all_v, mask=mask)
        h = h + attn.to_add_out(a.flatten(-2, -1))
        h = h + layer.mlp_moe_gen(layer.post_attention_layernorm_moe_gen(h))
    preds = transformer.proj_out(transformer.norm_moe_gen(h))                # [B, N, patch values]
    out = []
    for r in range(b):
        (t, hh, ww), = shapes[r]
        p = cfg.latent_patch_size
        grid = (t, -(-hh // p), -(-ww // p))
        frames = torch.arange(t, device=x.device)
        out.extend(transformer._unpatchify_and_unpack_latents(preds[r], [grid], [frames], [(t, hh, ww)]))
    return out
