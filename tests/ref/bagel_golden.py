"""Writes tests/data/bagel_golden.npz: BAGEL's own text-to-image code (github ByteDance-Seed/Bagel, not
installable from a package registry, so CI cannot run it) on the tiny random checkpoint
(converters/tiny_bagel.py), for tests/test_image_bagel.py to compare our pipeline with.

    python tests/ref/bagel_golden.py UPSTREAM_CHECKOUT [--checkpoint checkpoints/tiny/bagel] [--out ...]

Run with UPSTREAM_CHECKOUT a checkout of ByteDance-Seed/Bagel (made with commit 056b5fd) and a Python
that has torch and transformers==4.49.0 (the release's pin; its modeling code imports transformers 4
internals), e.g. `pip install --target DIR --no-deps transformers==4.49.0 tokenizers==0.21.0
huggingface_hub==0.29.1` and DIR first on PYTHONPATH, with this repository's torch. CPU only.

The release's code is run as it is, with two stand-ins, both exact in float32:
  - `flash_attn.flash_attn_varlen_func` (a CUDA-only package) is replaced by the same function in plain
    torch: per packed sequence, softmax attention with flash-attn's causal alignment (bottom right);
  - its generation path hard-casts activations to bfloat16 (for flash-attn); the module's `torch.bfloat16`
    is pointed at float32 so the reference runs in float32 and the comparison can be tight.
Everything else (packing, masks, positions, MoT routing, timestep embedding, schedule, CFG + renorm, the
FLUX autoencoder, its unpacking of the latents) is the release's code, called as its InterleaveInferencer
calls it for a text prompt. Noise: the release draws it from torch's global generator right after
`torch.manual_seed(seed)`.
"""
from __future__ import annotations

import argparse
import importlib.machinery
import json
import sys
import types
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[2]

# (name, prompt, (H, W), model calls, cfg_text_scale, seed). 6 calls: the last one (t = 0.375) is outside
# cfg_interval (0.4, 1], so the CFG on/off switch is covered.
CASES = [("cfg", "a red cat on a hill", (48, 32), 6, 4.0, 7),
         ("no_cfg", "two boats", (32, 32), 2, 1.0, 3)]


def flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q=None, max_seqlen_k=None,
                           causal=False, **_):
    """flash-attn's varlen attention in plain torch: q [Tq, H, d], k/v [Tk, Hkv, d], packed sequences."""
    out = []
    for i in range(len(cu_seqlens_q) - 1):
        qs = q[cu_seqlens_q[i]:cu_seqlens_q[i + 1]].transpose(0, 1)
        ks = k[cu_seqlens_k[i]:cu_seqlens_k[i + 1]].transpose(0, 1)
        vs = v[cu_seqlens_k[i]:cu_seqlens_k[i + 1]].transpose(0, 1)
        groups = qs.shape[0] // ks.shape[0]
        ks, vs = ks.repeat_interleave(groups, 0), vs.repeat_interleave(groups, 0)
        mask = None
        if causal:      # flash-attn aligns the causal mask to the bottom right
            tq, tk = qs.shape[1], ks.shape[1]
            mask = torch.ones(tq, tk, dtype=torch.bool).tril(diagonal=tk - tq)
        out.append(F.scaled_dot_product_attention(qs, ks, vs, attn_mask=mask).transpose(0, 1))
    return torch.cat(out)


class Float32Torch(types.ModuleType):
    """`torch` with bfloat16 meaning float32 (see the module doc)."""

    bfloat16 = torch.float32

    def __getattr__(self, name):
        return getattr(torch, name)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("upstream")
    parser.add_argument("--checkpoint", default=str(ROOT / "checkpoints" / "tiny" / "bagel"))
    parser.add_argument("--out", default=str(ROOT / "tests" / "data" / "bagel_golden.npz"))
    args = parser.parse_args()
    sys.path.insert(0, str(Path(args.upstream).resolve()))
    from safetensors.torch import load_file
    from transformers import PreTrainedTokenizerFast

    stand_in = types.ModuleType("flash_attn")
    stand_in.__spec__ = importlib.machinery.ModuleSpec("flash_attn", None)   # found, but has no version:
    stand_in.flash_attn_varlen_func = flash_attn_varlen_func                 # transformers will not use it
    sys.modules["flash_attn"] = stand_in

    import modeling.bagel.qwen2_navit as navit
    from data.data_utils import add_special_tokens
    from inferencer import InterleaveInferencer
    from modeling.autoencoder import AutoEncoder, AutoEncoderParams
    from modeling.bagel import Bagel, BagelConfig, Qwen2Config, Qwen2ForCausalLM

    navit.torch = Float32Torch("torch")
    folder = Path(args.checkpoint)
    llm_config = Qwen2Config.from_json_file(str(folder / "llm_config.json"))
    # What the release's app.py sets in code.
    llm_config.qk_norm, llm_config.tie_word_embeddings = True, False
    llm_config.layer_module = "Qwen2MoTDecoderLayer"
    # The release's load_ae hard-codes FLUX's autoencoder; the tiny one is smaller (converters/tiny_bagel.py).
    from triton_omni.converters.tiny_bagel import AE_CH, AE_CH_MULT, AE_RES_BLOCKS, LATENT_CHANNELS, MAX_LATENT_SIZE
    ae_params = AutoEncoderParams(resolution=256, in_channels=3, downsample=8, ch=AE_CH, out_ch=3,
                                  ch_mult=list(AE_CH_MULT), num_res_blocks=AE_RES_BLOCKS, z_channels=LATENT_CHANNELS,
                                  scale_factor=0.3611, shift_factor=0.1159)
    vae = AutoEncoder(ae_params)
    vae.load_state_dict(load_file(str(folder / "ae.safetensors")), strict=True)
    vae.eval()
    config = BagelConfig(visual_gen=True, visual_und=False, llm_config=llm_config, vit_config=None,
                         vae_config=ae_params, latent_patch_size=2, max_latent_size=MAX_LATENT_SIZE)
    model = Bagel(Qwen2ForCausalLM(llm_config), None, config)
    state = load_file(str(folder / "ema.safetensors"))
    missing, unexpected = model.load_state_dict(state, strict=False)
    assert not missing, missing
    assert all(k.startswith(("vit_model.", "connector.", "vit_pos_embed.")) for k in unexpected), unexpected
    model.eval()
    # The tokenizer from its tokenizer.json (transformers 4.49 cannot read the tokenizer_config.json that
    # transformers 5 writes); the release calls only encode() and the special-token lookups.
    tokenizer = PreTrainedTokenizerFast(tokenizer_file=str(folder / "tokenizer.json"))
    tokenizer, new_token_ids, _ = add_special_tokens(tokenizer)
    # The four tokens must be the checkpoint's own (re-registering them must not make new ids).
    stored = {t["content"]: t["id"] for t in json.loads((folder / "tokenizer.json").read_text())["added_tokens"]}
    wrappers = ("<|im_start|>", "<|im_end|>", "<|vision_start|>", "<|vision_end|>")
    assert sorted(new_token_ids.values()) == sorted(stored[t] for t in wrappers), new_token_ids
    inferencer = InterleaveInferencer(model, vae, tokenizer, None, None, new_token_ids)

    seen = {}
    decode = vae.decode

    def keep(z):
        seen["latents"] = z.detach().clone()
        return decode(z)

    vae.decode = keep
    golden = {}
    with torch.no_grad():
        for name, prompt, (h, w), calls, scale, seed in CASES:
            torch.manual_seed(seed)
            [image] = inferencer.interleave_inference(
                [prompt], cfg_text_scale=scale, cfg_img_scale=1.0, cfg_interval=[0.4, 1.0], timestep_shift=3.0,
                num_timesteps=calls + 1, cfg_renorm_min=0.0, cfg_renorm_type="global", image_shapes=(h, w))
            golden[f"{name}_latents"] = seen["latents"][0].float().numpy()      # [C, H / 8, W / 8]
            golden[f"{name}_pixels"] = np.asarray(image, dtype=np.uint8)        # the release's PIL image
    golden["cases"] = np.array(json.dumps(CASES))
    np.savez_compressed(args.out, **golden)
    print(f"wrote {args.out}: " + ", ".join(f"{k} {v.shape}" for k, v in golden.items()))


if __name__ == "__main__":
    main()
