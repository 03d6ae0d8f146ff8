"""Reference outputs of the `fish-speech` package (0.1.0: the S1-mini release) for a tiny Fish S2-Pro
folder, to an .npz. Runs in .venv-fish (scripts/setup_reference_envs.sh fish) as a subprocess of
tests/test_tts_fish_parity.py, never imported by the suite.

    python tests/ref/fish_ref.py SPEC.json FOLDER OUT.npz

What S2-Pro shares with the package, built with the package's own classes at the folder's sizes:
- the dual-AR transformer (DualARTransformer: slow blocks, codebook embeddings scaled by 1/sqrt(N+1),
  fast blocks over [project_in(h), E(codes)...]). S2-Pro's loader renames its tensors (text_model.model.X
  -> X, audio_decoder.X -> fast_X, codebook_embeddings kept) and feeds the fast AR the slow model's
  final-norm output; the package (S1) feeds the pre-norm one, so its fast_project_in is wrapped with the
  slow model's final norm here: the one place the S2 arithmetic is patched in;
- the codec (DAC with DownsampleResidualVectorQuantize: the same classes and yaml as S2-Pro's), both
  ways: DAC.decode of codes, and a reference clip's codes as the release's encode_audio makes them
  (torchaudio's resample to 44.1 kHz, then DAC.encode);
- the content-sequence encoding (text parts tokenized one by one, a VQ part as semantic ids over its
  codes): S2-Pro's cloning prompt is laid out as the upstream generate_long / Conversation lay out
  its parts (system turn: head, `<|speaker:0|>` + transcript, "Speech:", the clip's codes) and
  encoded with the package's ContentSequence.encode_for_inference and the folder's HF tokenizer. The
  layout itself is read from the upstream source, not run (the package has no Conversation).
The talker's tokenizer is a stub holding the folder's semantic id range (the package's own reads
tiktoken files).

SPEC: {"prompt": [[T x (N+1)]], "frames": [[F x (N+1)]], "codes": [[N x L]], "clip": [S], "clip_rate": R,
"clone": {"text": ..., "reference_text": ..., "codes": [[N x F]]}}
Out: `slow_logits` [F + 1, V] (after the prompt, then after each frame), `fast_logits` [F, N - 1, C]
(teacher-forced by the frame's codes), `wave` (DAC.decode of `codes`), `clip_codes` [N, F'] (the clip
encoded), `clip_latent` [latent, F'] (what its quantizers read), `clone_prompt` [N + 1, T'] (the
cloning prompt), `missing` (keys the codec checkpoint did not fill: must be none but the package's
non-parameter buffers).
"""
from __future__ import annotations

import json
import sys
from collections import OrderedDict
from functools import partial
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import torch


def talker(folder: Path):
    from safetensors.torch import load_file
    from fish_speech.models.text2semantic.llama import DualARModelArgs, DualARTransformer

    raw = json.loads((folder / "config.json").read_text())
    t, a = raw["text_config"], raw["audio_decoder_config"]
    args = DualARModelArgs(
        model_type="dual_ar", vocab_size=t["vocab_size"], n_layer=t["n_layer"], n_head=t["n_head"],
        n_local_heads=t["n_local_heads"], head_dim=t["head_dim"], dim=t["dim"],
        intermediate_size=t["intermediate_size"], rope_base=t["rope_base"], norm_eps=t["norm_eps"],
        max_seq_len=t["max_seq_len"], tie_word_embeddings=t["tie_word_embeddings"],
        attention_qk_norm=t["attention_qk_norm"], scale_codebook_embeddings=True,
        codebook_size=a["vocab_size"], num_codebooks=a["num_codebooks"], n_fast_layer=a["n_layer"],
        fast_dim=a["dim"], fast_n_head=a["n_head"], fast_n_local_heads=a["n_local_heads"],
        fast_head_dim=a["head_dim"], fast_intermediate_size=a["intermediate_size"],
        fast_attention_qk_norm=a["attention_qk_norm"], use_gradient_checkpointing=False)
    begin, end = raw["semantic_start_token_id"], raw["semantic_end_token_id"]
    stub = SimpleNamespace(semantic_id_to_token_id={i: begin + i for i in range(end - begin + 1)},
                           semantic_begin_id=begin, semantic_end_id=end)
    model = DualARTransformer(args, tokenizer=stub)
    weights = OrderedDict()
    for k, v in load_file(str(folder / "model.safetensors")).items():     # S2-Pro's renaming
        if k.startswith("text_model.model."):
            k = k[len("text_model.model."):]
        elif k.startswith("audio_decoder."):
            k = k[len("audio_decoder."):]
            k = k if k.startswith("codebook_embeddings.") else "fast_" + k
        weights[k] = v
    missing, unexpected = model.load_state_dict(weights, strict=False)
    assert not unexpected and not missing, (missing, unexpected)
    model.fast_project_in = torch.nn.Sequential(model.norm, model.fast_project_in)   # S2: fast AR reads the normed h
    model.eval()
    model.setup_caches(1, args.max_seq_len, dtype=torch.float32)
    return model, args


@torch.no_grad()
def run_talker(model, args, prompt: torch.Tensor, frames: torch.Tensor) -> tuple[np.ndarray, np.ndarray]:
    slow, fast = [], []
    seq = [prompt.T[None]] + [f[:, None][None] for f in frames]
    pos = 0
    for i, x in enumerate(seq):
        n = x.shape[-1]
        out = model.forward_generate(x, torch.arange(pos, pos + n))
        pos += n
        slow.append(out.logits[0, -1])
        if i == len(frames):
            break
        codes = frames[i, 1:]
        for layer in model.fast_layers:
            layer.attention.kv_cache.k_cache.fill_(0)
            layer.attention.kv_cache.v_cache.fill_(0)
        model.forward_generate_fast(out.hidden_states, torch.tensor([0]))
        row = []
        for j in range(1, args.num_codebooks):
            h = model.fast_embeddings(codes[j - 1:j])
            row.append(model.forward_generate_fast(h, torch.tensor([j]))[0, -1])
        fast.append(torch.stack(row))
    return torch.stack(slow).numpy(), torch.stack(fast).numpy()


@torch.no_grad()
def run_codec(folder: Path, codes: torch.Tensor, clip: torch.Tensor, clip_rate: int) -> tuple:
    from fish_speech.models.dac.modded_dac import DAC, ModelArgs, WindowLimitedTransformer
    from fish_speech.models.dac.rvq import DownsampleResidualVectorQuantize

    sd = torch.load(str(folder / "codec.pth"), map_location="cpu", weights_only=True)
    latent = sd["quantizer.semantic_quantizer.quantizers.0.out_proj.weight_g"].shape[0]
    n_res = len({k.split(".")[3] for k in sd if k.startswith("quantizer.quantizer.quantizers.")})
    post_layers = len({k.split(".")[3] for k in sd if k.startswith("quantizer.post_module.layers.")})
    hidden = sd["quantizer.post_module.layers.0.feed_forward.w1.weight"].shape[0]
    pre_layers = len({k.split(".")[3] for k in sd if k.startswith("quantizer.pre_module.layers.")})
    encoder_layers = len({k.split(".")[6] for k in sd if k.startswith("encoder.block.4.block.5.layers.")})
    decoder_dim = sd["decoder.model.0.conv.parametrizations.weight.original0"].shape[0]
    post = lambda n: WindowLimitedTransformer(  # noqa: E731 - modded_dac_vq.yaml's post/pre module, tiny sizes
        causal=True, window_size=128, input_dim=latent,
        config=ModelArgs(block_size=2048, n_layer=n, n_head=latent // 64, dim=latent,
                         intermediate_size=hidden, head_dim=64, channels_first=True))
    quantizer = DownsampleResidualVectorQuantize(
        input_dim=latent, n_codebooks=n_res, codebook_size=sd["quantizer.quantizer.quantizers.0.codebook.weight"].shape[0],
        codebook_dim=8, semantic_codebook_size=sd["quantizer.semantic_quantizer.quantizers.0.codebook.weight"].shape[0],
        downsample_factor=(2, 2), post_module=post(post_layers), pre_module=post(pre_layers))
    general = partial(ModelArgs, block_size=8192, head_dim=64, channels_first=True)
    dac = DAC(encoder_dim=latent // 16, encoder_rates=[2, 4, 8, 8], decoder_dim=decoder_dim, decoder_rates=[8, 8, 4, 2],
              quantizer=quantizer, sample_rate=44100, causal=True, encoder_transformer_layers=[0, 0, 0, encoder_layers],
              decoder_transformer_layers=[4, 0, 0, 0], transformer_general_config=general)
    result = dac.load_state_dict(sd, strict=False)                 # as the release loads codec.pth
    dac.eval()
    wave = dac.decode(codes[None], torch.tensor([codes.shape[-1]]))[0][0, 0].numpy()
    # the release's encode_audio (inference.py): torchaudio's resample, then DAC.encode (its server's
    # transforms.Resample computes the same kernel in float64 before rounding it to float32)
    import torchaudio

    audio = torchaudio.functional.resample(clip[None], clip_rate, 44100)
    indices, lengths = dac.encode(audio[None], torch.tensor([audio.shape[-1]]))
    # what the quantizers read (DAC.encode pads the clip to whole frames first)
    x = torch.nn.functional.pad(audio[None], (0, -audio.shape[-1] % dac.frame_length))
    latent = dac.quantizer.pre_module(dac.quantizer.downsample(dac.encoder(x)))[0].numpy()
    return wave, indices[0, :, :lengths[0]].numpy(), latent, result.missing_keys


def clone_prompt(folder: Path, spec: dict, num_codebooks: int) -> np.ndarray:
    """S2-Pro's cloning prompt (upstream generate_long: a system turn with the reference, the user's
    text, the open assistant voice turn), encoded by the package's ContentSequence."""
    from transformers import PreTrainedTokenizerFast
    from fish_speech.content_sequence import ContentSequence, TextPart, VQPart

    # the folder's tokenizer.json (its tokenizer_config names a class of our newer transformers)
    hf = PreTrainedTokenizerFast(tokenizer_file=str(folder / "tokenizer.json"))
    vocab = hf.get_vocab()
    semantic = {i: vocab[f"<|semantic:{i}|>"] for i in range(4096) if f"<|semantic:{i}|>" in vocab}
    tokenizer = SimpleNamespace(encode=lambda text: hf.encode(text, add_special_tokens=False),
                                semantic_id_to_token_id=semantic, semantic_begin_id=min(semantic.values()))
    codes = torch.tensor(spec["codes"])
    parts = [TextPart(text="<|im_start|>system\n"),
             TextPart(text="convert the provided text to speech reference to the following:\n\nText:\n"),
             TextPart(text="<|speaker:0|>" + spec["reference_text"]), TextPart(text="\n\nSpeech:\n"),
             VQPart(codes=codes), TextPart(text="<|im_end|>\n"),
             TextPart(text="<|im_start|>user\n"), TextPart(text=spec["text"]), TextPart(text="<|im_end|>\n"),
             TextPart(text="<|im_start|>assistant\n<|voice|>")]
    values, _, _ = ContentSequence(parts=parts).encode_for_inference(tokenizer, num_codebooks=num_codebooks)
    return values.numpy()


def main() -> None:
    spec, folder, out = json.loads(Path(sys.argv[1]).read_text()), Path(sys.argv[2]), sys.argv[3]
    torch.manual_seed(0)
    model, args = talker(folder)
    slow, fast = run_talker(model, args, torch.tensor(spec["prompt"]), torch.tensor(spec["frames"]))
    wave, clip_codes, clip_latent, missing = run_codec(folder, torch.tensor(spec["codes"]), torch.tensor(spec["clip"]),
                                          spec["clip_rate"])
    prompt = clone_prompt(folder, spec["clone"], args.num_codebooks)
    np.savez(out, slow_logits=slow, fast_logits=fast, wave=wave, clip_codes=clip_codes, clip_latent=clip_latent,
             clone_prompt=prompt,
             missing=np.array(missing, dtype=object))


if __name__ == "__main__":
    main()
