"""diffusers' ZImageTransformer2DModel.forward split in two: what a denoise loop computes once per
group of requests, and what it computes at every step.

The transformer's forward re-derives, at every call, things that depend only on the captions and the
image size: the captions' embedding and their two refiner blocks (no timestep modulation), every
position id and RoPE table, the padding masks and the per-item loops that lay the sequences out.
At 512x512 that host-side work showed as the gap between our per-block compiled call (35.0 ms) and
diffusers' whole-model compile (27.7 ms). `ZImageContext` computes it once per group (and once more
for the group's CFG rows); `step` then runs only the timestep-dependent part: patchify, the image
embedding, the noise refiner, the 30 main blocks, the final layer and unpatchify, batched.

The arithmetic is the model's own, in the same order, so outputs equal the forward's (the tests
compare them). The layout rules it mirrors, for the basic (non-omni) mode:
- each caption is padded to a multiple of 32 with the caption pad token, each image's patch sequence
  likewise with the image pad token; pad tokens take part in attention unless sequences of one call
  differ in length (then a key mask covers only the padding up to the longest);
- caption tokens sit at positions (1 + k, 0, 0), image patches at (padded caption length + 1, h, w),
  image pad tokens at (0, 0, 0);
- the main blocks see [image tokens, caption tokens] per item, zero-padded to the longest item.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

SEQ_MULTI_OF = 32      # diffusers' transformer_z_image.SEQ_MULTI_OF


def _padded(n: int) -> int:
    return n + (-n) % SEQ_MULTI_OF


def _key_mask(lengths: list[int], device) -> torch.Tensor | None:
    """[B, max] True at each item's first `length` keys; None when all items are equally long."""
    longest = max(lengths)
    if all(n == longest for n in lengths):
        return None
    return torch.arange(longest, device=device)[None, :] < torch.tensor(lengths, device=device)[:, None]


@dataclass
class ZImageContext:
    """The step-invariant part of the transformer's inputs for one batch of items (images x captions)."""

    caption: torch.Tensor                  # [B, Lc_max, D] captions after embedding and the context refiner
    x_freqs: torch.Tensor                  # [B, Lx, head_dim / 2] complex RoPE of the image tokens
    unified_freqs: torch.Tensor            # [B, Lu_max, head_dim / 2] RoPE of [image, caption]
                                           #   (both [..., 2] real pairs after prepare(real_rotary=True))
    unified_mask: torch.Tensor | None      # [B, Lu_max] keys to attend to; None: all
    unified_index: torch.Tensor | None     # [B, Lu_max] rows of [x | caption | zero] making the sequence;
                                           #   None: plain concatenation (all captions equally long)
    caption_lens: list[int]                # the captions' real tokens, per item
    tokens: int                            # image patches before padding
    patch: tuple[int, int]                 # (spatial, temporal) patch size


def prepare(model, captions: list[torch.Tensor], grid: tuple[int, int, int], patch_size: int = 2,
            f_patch_size: int = 1, real_rotary: bool = False) -> ZImageContext:
    """Everything about `captions` ([L_i, cap_feat_dim] each, one per batch item) and an image latent
    grid (F, H, W) that the forward would recompute at every step. `real_rotary`: the per-step RoPE
    tables as [..., 2] (cos, sin) float pairs, for a model prepared by `use_real_rotary`."""
    device = captions[0].device
    F, H, W = grid
    ft, ht, wt = F // f_patch_size, H // patch_size, W // patch_size
    tokens = ft * ht * wt
    x_len = _padded(tokens)
    cap_lens = [_padded(len(c)) for c in captions]

    # captions: pad by repeating the last row (its embedding is then replaced by the pad token),
    # embed all rows at once, refine; the forward's _pad_with_ids / _prepare_sequence layout
    feats = [torch.cat([c, c[-1:].expand(n - len(c), -1)]) for c, n in zip(captions, cap_lens)]
    is_pad = torch.cat([torch.arange(n, device=device) >= len(c) for c, n in zip(captions, cap_lens)])
    embedded = model.cap_embedder(torch.cat(feats))
    embedded = torch.where(is_pad.unsqueeze(-1), model.cap_pad_token, embedded)
    cap_pos = [model.create_coordinate_grid((n, 1, 1), (1, 0, 0), device).flatten(0, 2) for n in cap_lens]
    cap_freqs = list(model.rope_embedder(torch.cat(cap_pos)).split(cap_lens))
    caption = torch.nn.utils.rnn.pad_sequence(list(embedded.split(cap_lens)), batch_first=True)
    cap_freqs_b = torch.nn.utils.rnn.pad_sequence(cap_freqs, batch_first=True)
    cap_mask = _key_mask(cap_lens, device)
    for layer in model.context_refiner:
        caption = layer(caption, cap_mask, cap_freqs_b)

    # image tokens: the patch grid starts after each item's caption; pad tokens at (0, 0, 0)
    pad_ids = torch.zeros((x_len - tokens, 3), device=device, dtype=torch.int32)
    x_pos = [torch.cat([model.create_coordinate_grid((ft, ht, wt), (n + 1, 0, 0), device).flatten(0, 2), pad_ids])
             for n in cap_lens]
    x_freqs = model.rope_embedder(torch.cat(x_pos)).view(len(captions), x_len, -1)

    # [image, caption] per item, zero-padded to the longest
    unified_lens = [x_len + n for n in cap_lens]
    unified_freqs = torch.nn.utils.rnn.pad_sequence(
        [torch.cat([x_freqs[i], cap_freqs[i]]) for i in range(len(captions))], batch_first=True)
    unified_index = None
    if any(n != cap_lens[0] for n in cap_lens):
        # rows of cat([x (x_len), caption (Lc_max), one zero row]) per item
        longest, cap_max = max(unified_lens), max(cap_lens)
        zero_row = x_len + cap_max
        unified_index = torch.full((len(captions), longest), zero_row, dtype=torch.long, device=device)
        for i, n in enumerate(cap_lens):
            unified_index[i, :x_len + n] = torch.arange(x_len + n, device=device)
    if real_rotary:
        x_freqs, unified_freqs = torch.view_as_real(x_freqs), torch.view_as_real(unified_freqs)
    return ZImageContext(caption=caption, x_freqs=x_freqs, unified_freqs=unified_freqs,
                         unified_mask=_key_mask(unified_lens, device), unified_index=unified_index,
                         caption_lens=[len(c) for c in captions], tokens=tokens, patch=(patch_size, f_patch_size))


def step(model, ctx: ZImageContext, x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
    """The transformer's output for latents `x` [B, C, F, H, W] at timesteps `t` [B] (the forward's `t`),
    [B, C, F, H, W], given the batch's `prepare`d context."""
    p, pf = ctx.patch
    B, C, F, H, W = x.shape
    ft, ht, wt = F // pf, H // p, W // p
    adaln = model.t_embedder(t * model.t_scale).type_as(x)

    # patchify: (C, F, H, W) -> (f h w, pf ph pw c) per item, as _patchify_image
    patches = x.view(B, C, ft, pf, ht, p, wt, p).permute(0, 2, 4, 6, 3, 5, 7, 1).reshape(B, ctx.tokens, -1)
    x_len = ctx.x_freqs.shape[1]
    if x_len > ctx.tokens:
        patches = torch.cat([patches, patches[:, -1:].expand(-1, x_len - ctx.tokens, -1)], dim=1)
    h = model.all_x_embedder[f"{p}-{pf}"](patches)
    if x_len > ctx.tokens:
        h = torch.cat([h[:, :ctx.tokens], model.x_pad_token.to(h.dtype).expand(B, x_len - ctx.tokens, -1)], dim=1)
    for layer in model.noise_refiner:
        h = layer(h, None, ctx.x_freqs, adaln)

    if ctx.unified_index is None:
        unified = torch.cat([h, ctx.caption], dim=1)
    else:
        rows = torch.cat([h, ctx.caption, h.new_zeros(B, 1, h.shape[-1])], dim=1)
        unified = rows.gather(1, ctx.unified_index.unsqueeze(-1).expand(-1, -1, h.shape[-1]))
    for layer in model.layers:
        unified = layer(unified, ctx.unified_mask, ctx.unified_freqs, adaln)
    out = model.all_final_layer[f"{p}-{pf}"](unified, c=adaln)

    # unpatchify: "f h w pf ph pw c -> c (f pf) (h ph) (w pw)" per item
    return (out[:, :ctx.tokens].reshape(B, ft, ht, wt, pf, p, p, model.out_channels)
            .permute(0, 7, 1, 4, 2, 5, 3, 6).reshape(B, model.out_channels, F, H, W))


class SplitForward(torch.nn.Module):
    """`step` as a module call, so that forward hooks (a benchmark's timer) see every denoise call."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, ctx: ZImageContext, x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        return step(self.model, ctx, x, t)


def rotate(x: torch.Tensor, cos_sin: torch.Tensor) -> torch.Tensor:
    """x [B, L, H, D] times the rotation of `cos_sin` [B, L, D/2, 2], each pair (x[2i], x[2i+1]) taken as
    the complex number diffusers' Z-Image attention makes of it: the same product in float32,
    (a + bi)(c + di) = (ac - bd) + (ad + bc)i, in real arithmetic (rounding may differ where the
    complex kernel fuses multiply-adds), then back to x's dtype."""
    a, b = x.float().unflatten(-1, (-1, 2)).unbind(-1)
    c, d = cos_sin.unsqueeze(2).unbind(-1)
    return torch.stack((a * c - b * d, a * d + b * c), dim=-1).flatten(3).type_as(x)


@functools.cache
def real_rotary_processor_class():
    """diffusers' Z-Image attention processor with the rotary product of `rotate`: torch.compile has
    no code generation for complex tensors and runs that product as separate eager kernels in every
    block (inductor warns so); in real arithmetic it fuses with the q/k norm around it. One class for
    all blocks: the compiled block code is shared, and it is specialised on the processor's class."""
    from diffusers.models.transformers.transformer_z_image import ZSingleStreamAttnProcessor, dispatch_attention_fn

    class RealRotaryProcessor(ZSingleStreamAttnProcessor):
        def __call__(self, attn, hidden_states, encoder_hidden_states=None, attention_mask=None, freqs_cis=None):
            q, k, v = (proj(hidden_states).unflatten(-1, (attn.heads, -1)) for proj in (attn.to_q, attn.to_k, attn.to_v))
            q = attn.norm_q(q) if attn.norm_q is not None else q
            k = attn.norm_k(k) if attn.norm_k is not None else k
            if freqs_cis is not None:
                q, k = rotate(q, freqs_cis), rotate(k, freqs_cis)
            if attention_mask is not None and attention_mask.ndim == 2:
                attention_mask = attention_mask[:, None, None, :]
            out = dispatch_attention_fn(q, k, v, attn_mask=attention_mask, dropout_p=0.0, is_causal=False,
                                        backend=self._attention_backend, parallel_config=self._parallel_config)
            out = attn.to_out[0](out.flatten(2, 3).to(q.dtype))
            return attn.to_out[1](out) if len(attn.to_out) > 1 else out

    return RealRotaryProcessor


def use_real_rotary(model) -> None:
    """The blocks that `step` runs take `prepare(real_rotary=True)` tables from now on (the caption
    refiner, run by `prepare`, keeps the complex ones). Each keeps its attention backend."""
    for layer in (*model.noise_refiner, *model.layers):
        old = layer.attention.processor
        new = real_rotary_processor_class()()
        new._attention_backend, new._parallel_config = old._attention_backend, old._parallel_config
        layer.attention.set_processor(new)
