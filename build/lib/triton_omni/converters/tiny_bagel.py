"""A tiny random BAGEL checkpoint (see converters/tiny.py), in the layout of the ByteDance-Seed/BAGEL-7B-MoT
release: llm_config.json (a Qwen2 config), vit_config.json (a SigLIP vision config), ema.safetensors (every
weight of the unified model: the Mixture-of-Transformers language model under `language_model.`, the
generation head, the ViT and its connector), ae.safetensors (FLUX's autoencoder in its own, non-diffusers
key names) and the Qwen2 tokenizer files.

Shapes keep what the serving code depends on: the MoT's two experts per layer (`*_moe_gen` twins of every
projection and norm), q/k norms, grouped-query attention, the VAE's 8x downsampling and 16 latent channels,
2x2 latent patches, the sin-cos latent position table. Everything else shrinks; the position table is
16 x 16 patches (256 px sides; the release's is 64 x 64, 1024 px).

tests/data/bagel_golden.npz is the release's output on this checkpoint: when its weights change, write it
again with tests/ref/bagel_golden.py.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch

from triton_omni.converters.tiny_common import qwen2_tokenizer

LATENT_CHANNELS = 16
PATCH = 2
MAX_LATENT_SIZE = 16          # patches per side of the latent position table
AE_CH, AE_CH_MULT, AE_RES_BLOCKS = 32, (1, 2, 2, 2), 1     # GroupNorm(32) needs multiples of 32 channels


def sincos_table(dim: int, grid: int) -> np.ndarray:
    """The fixed 2-D sin-cos position table [grid * grid, dim] that BAGEL's release stores for its latent
    and ViT positions: half the channels encode one grid axis, half the other, each as sin then cos."""
    def axis(d: int, pos: np.ndarray) -> np.ndarray:
        omega = 1.0 / 10000 ** (np.arange(d // 2, dtype=np.float64) / (d / 2))
        angles = np.outer(pos.reshape(-1), omega)
        return np.concatenate([np.sin(angles), np.cos(angles)], axis=1)

    cols, rows = np.meshgrid(np.arange(grid, dtype=np.float32), np.arange(grid, dtype=np.float32))
    # The table lists (row, col) cells row-major; its first half encodes the column index.
    return np.concatenate([axis(dim // 2, cols), axis(dim // 2, rows)], axis=1).astype(np.float32)


def _random(shape, g: torch.Generator, std: float) -> torch.Tensor:
    return std * torch.randn(shape, generator=g)


def _norm(shape, g: torch.Generator) -> torch.Tensor:
    return 1.0 + 0.1 * torch.randn(shape, generator=g)


def llm_config(vocab_size: int) -> dict:
    from transformers import Qwen2Config

    config = Qwen2Config(vocab_size=vocab_size, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096,
                         rope_parameters={"rope_type": "default", "rope_theta": 1000000.0}, rms_norm_eps=1e-6,
                         tie_word_embeddings=False, architectures=["Qwen2ForCausalLM"])
    # The release's file is a transformers 4 Qwen2 config: rope_theta at the top level.
    return {**config.to_dict(), "rope_theta": 1000000.0}


def language_model_weights(cfg: dict, g: torch.Generator) -> dict[str, torch.Tensor]:
    """The MoT language model: Qwen2 layers (q/k/v with bias, o without) plus q/k norms, each projection,
    MLP and norm twinned by a `*_moe_gen` copy that the image tokens use."""
    d, inter, vocab = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"]
    heads, kv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    hd = d // heads
    w = {"language_model.model.embed_tokens.weight": _random((vocab, d), g, 1.0),
         "language_model.model.norm.weight": _norm((d,), g),
         "language_model.model.norm_moe_gen.weight": _norm((d,), g),
         "language_model.lm_head.weight": _random((vocab, d), g, 0.1)}
    for i in range(cfg["num_hidden_layers"]):
        p = f"language_model.model.layers.{i}."
        for gen in ("", "_moe_gen"):
            w.update({
                f"{p}self_attn.q_proj{gen}.weight": _random((heads * hd, d), g, 0.15),
                f"{p}self_attn.q_proj{gen}.bias": _random((heads * hd,), g, 0.1),
                f"{p}self_attn.k_proj{gen}.weight": _random((kv * hd, d), g, 0.15),
                f"{p}self_attn.k_proj{gen}.bias": _random((kv * hd,), g, 0.1),
                f"{p}self_attn.v_proj{gen}.weight": _random((kv * hd, d), g, 0.15),
                f"{p}self_attn.v_proj{gen}.bias": _random((kv * hd,), g, 0.1),
                f"{p}self_attn.o_proj{gen}.weight": _random((d, heads * hd), g, 0.15),
                f"{p}self_attn.q_norm{gen}.weight": _norm((hd,), g),
                f"{p}self_attn.k_norm{gen}.weight": _norm((hd,), g),
                f"{p}mlp{gen}.gate_proj.weight": _random((inter, d), g, 0.15),
                f"{p}mlp{gen}.up_proj.weight": _random((inter, d), g, 0.15),
                f"{p}mlp{gen}.down_proj.weight": _random((d, inter), g, 0.1),
                f"{p}input_layernorm{gen}.weight": _norm((d,), g),
                f"{p}post_attention_layernorm{gen}.weight": _norm((d,), g),
            })
    return w


def generation_weights(d: int, g: torch.Generator) -> dict[str, torch.Tensor]:
    """The image-generation head: timestep MLP (256 sinusoid features), latent patch <-> hidden
    projections, and the fixed latent position table."""
    patch_dim = PATCH * PATCH * LATENT_CHANNELS
    return {"time_embedder.mlp.0.weight": _random((d, 256), g, 0.1), "time_embedder.mlp.0.bias": _random((d,), g, 0.1),
            "time_embedder.mlp.2.weight": _random((d, d), g, 0.1), "time_embedder.mlp.2.bias": _random((d,), g, 0.1),
            "vae2llm.weight": _random((d, patch_dim), g, 0.2), "vae2llm.bias": _random((d,), g, 0.1),
            # The release initialises llm2vae at zero and trains it; random here, so the velocity is not 0.
            "llm2vae.weight": _random((patch_dim, d), g, 0.2), "llm2vae.bias": _random((patch_dim,), g, 0.05),
            "latent_pos_embed.pos_embed": torch.from_numpy(sincos_table(d, MAX_LATENT_SIZE))}


def vit_config() -> dict:
    from transformers import SiglipVisionConfig

    return SiglipVisionConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                              image_size=56, patch_size=14).to_dict()


def vit_weights(cfg: dict, d: int, g: torch.Generator) -> dict[str, torch.Tensor]:
    """The understanding ViT, as the release stores it (its patch convolution flattened to a linear layer)
    with the connector to the language model. Text-to-image never runs it; it is here for the layout."""
    from transformers import SiglipVisionConfig, SiglipVisionModel

    torch.manual_seed(int(torch.randint(0, 2**31, (1,), generator=g)))
    model = SiglipVisionModel(SiglipVisionConfig(**{k: v for k, v in cfg.items() if k != "transformers_version"}))
    # Stored under vit_model.vision_model., without the pooling head (the release's ViT has none).
    w = {f"vit_model.vision_model.{k}": v.detach().clone() for k, v in model.state_dict().items()
         if "position_ids" not in k and not k.startswith("head.")}
    conv = w["vit_model.vision_model.embeddings.patch_embedding.weight"]
    w["vit_model.vision_model.embeddings.patch_embedding.weight"] = conv.permute(0, 2, 3, 1).reshape(conv.shape[0], -1)
    vd = cfg["hidden_size"]
    w.update({"connector.fc1.weight": _random((d, vd), g, 0.1), "connector.fc1.bias": torch.zeros(d),
              "connector.fc2.weight": _random((d, d), g, 0.1), "connector.fc2.bias": torch.zeros(d),
              "vit_pos_embed.pos_embed": torch.from_numpy(sincos_table(d, 4))})
    return w


def _resnet(prefix: str, cin: int, cout: int, g: torch.Generator) -> dict[str, torch.Tensor]:
    w = {f"{prefix}.norm1.weight": _norm((cin,), g), f"{prefix}.norm1.bias": _random((cin,), g, 0.05),
         f"{prefix}.conv1.weight": _random((cout, cin, 3, 3), g, (1 / (9 * cin)) ** 0.5),
         f"{prefix}.conv1.bias": _random((cout,), g, 0.05),
         f"{prefix}.norm2.weight": _norm((cout,), g), f"{prefix}.norm2.bias": _random((cout,), g, 0.05),
         f"{prefix}.conv2.weight": _random((cout, cout, 3, 3), g, (1 / (9 * cout)) ** 0.5),
         f"{prefix}.conv2.bias": _random((cout,), g, 0.05)}
    if cin != cout:
        w[f"{prefix}.nin_shortcut.weight"] = _random((cout, cin, 1, 1), g, (1 / cin) ** 0.5)
        w[f"{prefix}.nin_shortcut.bias"] = _random((cout,), g, 0.05)
    return w


def _attention(prefix: str, c: int, g: torch.Generator) -> dict[str, torch.Tensor]:
    w = {f"{prefix}.norm.weight": _norm((c,), g), f"{prefix}.norm.bias": _random((c,), g, 0.05)}
    for name in ("q", "k", "v", "proj_out"):
        w[f"{prefix}.{name}.weight"] = _random((c, c, 1, 1), g, (1 / c) ** 0.5)
        w[f"{prefix}.{name}.bias"] = _random((c,), g, 0.05)
    return w


def _conv(prefix: str, cout: int, cin: int, g: torch.Generator) -> dict[str, torch.Tensor]:
    return {f"{prefix}.weight": _random((cout, cin, 3, 3), g, (1 / (9 * cin)) ** 0.5),
            f"{prefix}.bias": _random((cout,), g, 0.05)}


def autoencoder_weights(g: torch.Generator) -> dict[str, torch.Tensor]:
    """FLUX's autoencoder (the release's ae.safetensors) with the original (LDM) key names: encoder.down.N,
    decoder.up.N (numbered by resolution level, highest resolution 0), mid.block_1/attn_1/block_2."""
    ch, mult, blocks, z = AE_CH, AE_CH_MULT, AE_RES_BLOCKS, LATENT_CHANNELS
    w = _conv("encoder.conv_in", ch, 3, g)
    cin = ch
    for i, m in enumerate(mult):
        for j in range(blocks):
            w.update(_resnet(f"encoder.down.{i}.block.{j}", cin, ch * m, g))
            cin = ch * m
        if i != len(mult) - 1:
            w.update(_conv(f"encoder.down.{i}.downsample.conv", cin, cin, g))
    for side in ("encoder", "decoder"):
        c = ch * mult[-1]
        if side == "decoder":
            w.update(_conv("decoder.conv_in", c, z, g))
        w.update(_resnet(f"{side}.mid.block_1", c, c, g))
        w.update(_attention(f"{side}.mid.attn_1", c, g))
        w.update(_resnet(f"{side}.mid.block_2", c, c, g))
        if side == "encoder":
            w.update({"encoder.norm_out.weight": _norm((c,), g), "encoder.norm_out.bias": _random((c,), g, 0.05)})
            w.update(_conv("encoder.conv_out", 2 * z, c, g))
    cin = ch * mult[-1]
    for i in reversed(range(len(mult))):
        for j in range(blocks + 1):
            w.update(_resnet(f"decoder.up.{i}.block.{j}", cin, ch * mult[i], g))
            cin = ch * mult[i]
        if i != 0:
            w.update(_conv(f"decoder.up.{i}.upsample.conv", cin, cin, g))
    w.update({"decoder.norm_out.weight": _norm((cin,), g), "decoder.norm_out.bias": _random((cin,), g, 0.05)})
    w.update(_conv("decoder.conv_out", 3, cin, g))
    return w


def bagel(out: Path) -> None:
    from safetensors.torch import save_file

    tokenizer = qwen2_tokenizer()
    tokenizer.save_pretrained(str(out))
    llm = llm_config(len(tokenizer))
    vit = vit_config()
    (out / "llm_config.json").write_text(json.dumps(llm, indent=2) + "\n")
    (out / "vit_config.json").write_text(json.dumps(vit, indent=2) + "\n")
    g = torch.Generator().manual_seed(42)
    weights = {**language_model_weights(llm, g), **generation_weights(llm["hidden_size"], g),
               **vit_weights(vit, llm["hidden_size"], g)}
    save_file({k: v.contiguous() for k, v in weights.items()}, str(out / "ema.safetensors"))
    save_file({k: v.contiguous() for k, v in autoencoder_weights(g).items()}, str(out / "ae.safetensors"))


BUILDERS: dict = {"bagel": bagel}
