"""Reference outputs of the official `chatterbox-tts` package (0.1.7) for a Chatterbox folder, to an .npz.

Runs in the separate reference environment (.venv-chatterbox), never imported by the test suite:
tests/test_tts_chatterbox.py executes it as a subprocess.

    python tests/ref/chatterbox_ref.py SPEC.json FOLDER OUT.npz

The package fixes its model sizes in code; the folder's config.json gives the tiny ones, passed to the
package's own classes the way they take them (an LLAMA_CONFIGS entry and the arguments of Perceiver,
UpsampleConformerEncoder, ConditionalDecoder, HiFTGenerator, ConvRNNF0Predictor). Then the folder is
loaded as ChatterboxTTS.from_local loads it (same files, same strictness) and generate() runs as is,
with three hooks that change no arithmetic: T3's max_new_tokens is the case's (the package hardcodes 1000),
torch's generator is seeded again with the case's seed just before S3Gen (our S3Gen step draws its noise
from its own generator seeded with the request's seed), and the tokens, the mel and the waveform before
the Perth watermark are recorded (the served audio is not watermarked).

Voice cloning: each "clone" case runs generate(text, audio_prompt_path=wav, ...) as is (prepare_conditionals
with librosa's soxr resampling), and records the conditioning it computed; the same conditioning is also
computed from the clip resampled to 16 kHz by torchaudio's resampler (the one S3Gen's embed_ref uses), to
compare the tokenizer and the voice encoder on identical input. The package's S3 tokenizer takes its sizes
from s3tokenizer's default ModelConfig instance (its constructor does not pass one on), so that instance
gets the folder's sizes.

SPEC: {"cases": [{"text", "seed", "max_new_tokens", + generate()'s keyword arguments}...],
       "s3gen": [{"tokens": [...], "seed"}...],
       "clone": [{"wav": path, "text", "seed", "max_new_tokens", + generate()'s keyword arguments}...]}
Out, per case i: `{i}.text_ids`, `{i}.tokens` (T3's raw output, stop token included), `{i}.mel`, `{i}.wave`,
`{i}.logits` (every decode step's cond and uncond speech logits [steps, 2, V]); per s3gen case k:
`s3gen.{k}.mel`, `s3gen.{k}.wave`; per clone case c: `clone.{c}.` + `wav24` (the clip as librosa loads it),
`wav16` (librosa's 16 kHz clip), `prompt_token`, `prompt_feat`, `embedding` (S3Gen's reference),
`speaker_emb`, `prompt_tokens` (T3's), `sinc.wav16` (torchaudio's 16 kHz clip), `sinc.speaker_emb`,
`sinc.prompt_tokens` (T3's from it), `tokens`, `wave` (generate's); and `load_problems`.
"""
from __future__ import annotations

import json
import sys
import warnings
from functools import partial
from pathlib import Path

import numpy as np
import torch


def tiny_sizes(config: dict) -> None:
    """Make the package's constructors build the folder's sizes."""
    from chatterbox.models.s3gen import s3gen
    from chatterbox.models.t3 import llama_configs
    from chatterbox.models.t3.modules import cond_enc, perceiver

    llama_configs.LLAMA_CONFIGS["checkpoint"] = config["t3"]["llama"]
    cond_enc.Perceiver = partial(perceiver.Perceiver, **config["t3"]["perceiver"])
    sizes = config["s3gen"]

    def sized(cls, key):
        return lambda *args, **kwargs: cls(*args, **{**kwargs, **sizes.get(key, {})})

    s3gen.UpsampleConformerEncoder = sized(s3gen.UpsampleConformerEncoder, "encoder")
    s3gen.ConditionalDecoder = sized(s3gen.ConditionalDecoder, "decoder")
    s3gen.HiFTGenerator = sized(s3gen.HiFTGenerator, "hift")
    s3gen.ConvRNNF0Predictor = sized(s3gen.ConvRNNF0Predictor, "f0_predictor")
    s3gen.CAMPPlus = sized(s3gen.CAMPPlus, "xvector")
    from s3tokenizer.model_v2 import S3TokenizerV2

    default = S3TokenizerV2.__init__.__defaults__[0]
    for key, value in sizes.get("tokenizer", {}).items():
        setattr(default, key, value)


def load(folder: Path, out: dict):
    """ChatterboxTTS.from_local with the T3 config named (the package's T3() takes the release sizes)."""
    from chatterbox.models.s3gen import S3Gen
    from chatterbox.models.t3 import T3
    from chatterbox.models.t3.modules.t3_config import T3Config
    from chatterbox.models.tokenizers import EnTokenizer
    from chatterbox.models.voice_encoder import VoiceEncoder
    from chatterbox.tts import ChatterboxTTS, Conditionals
    from safetensors.torch import load_file

    config = json.loads((folder / "config.json").read_text())
    tiny_sizes(config)
    ve = VoiceEncoder()
    ve.load_state_dict(load_file(folder / "ve.safetensors"))
    hp = T3Config.english_only()
    hp.llama_config_name = "checkpoint"
    t3 = T3(hp)
    t3.load_state_dict(load_file(folder / "t3_cfg.safetensors"))
    s3gen = S3Gen()
    problems = s3gen.load_state_dict(load_file(folder / "s3gen.safetensors"), strict=False)
    # the S3 tokenizer's mel filters and window are computed by the package, not stored (as in the release)
    missing = [k for k in problems.missing_keys if k not in ("tokenizer._mel_filters", "tokenizer.window")]
    out["load_problems"] = np.array(json.dumps({"missing": missing, "unexpected": problems.unexpected_keys}))
    conds = Conditionals.load(folder / "conds.pt", map_location="cpu")
    tts = ChatterboxTTS(t3.eval(), s3gen.eval(), ve.eval(), EnTokenizer(str(folder / "tokenizer.json")), "cpu",
                        conds=conds)
    return tts


def main(spec_path: str, folder: str, out_path: str) -> None:
    warnings.filterwarnings("ignore")
    from chatterbox.models.t3.inference.t3_hf_backend import T3HuggingfaceBackend
    from chatterbox.tts import punc_norm

    spec = json.loads(Path(spec_path).read_text())
    out: dict[str, np.ndarray] = {}
    tts = load(Path(folder), out)
    step_logits: list[torch.Tensor] = []
    backend_forward = T3HuggingfaceBackend.forward

    def forward(self, *args, **kwargs):
        result = backend_forward(self, *args, **kwargs)
        step_logits.append(result.logits[:, -1].clone())
        return result

    T3HuggingfaceBackend.forward = forward
    t3_inference, s3_inference, flow_inference = tts.t3.inference, tts.s3gen.inference, tts.s3gen.flow_inference
    for i, case in enumerate(spec["cases"]):
        case = dict(case)
        seed, max_new = case.pop("seed"), case.pop("max_new_tokens")
        text = case.pop("text")
        seen = {}

        def t3_run(**kwargs):
            seen["tokens"] = t3_inference(**{**kwargs, "max_new_tokens": max_new})
            return seen["tokens"]

        def s3_run(*args, **kwargs):
            torch.manual_seed(seed)
            seen["wave"] = s3_inference(*args, **kwargs)[0].clone()
            return seen["wave"], None

        def flow_run(*args, **kwargs):
            seen["mel"] = flow_inference(*args, **kwargs)
            return seen["mel"]

        tts.t3.inference, tts.s3gen.inference, tts.s3gen.flow_inference = t3_run, s3_run, flow_run
        step_logits.clear()
        torch.manual_seed(seed)
        tts.generate(text, **case)
        out[f"{i}.text_ids"] = tts.tokenizer.text_to_tokens(punc_norm(text))[0].numpy()
        out[f"{i}.tokens"] = seen["tokens"][0].numpy()
        out[f"{i}.mel"] = seen["mel"][0].numpy()
        out[f"{i}.wave"] = seen["wave"][0].numpy()
        out[f"{i}.logits"] = torch.stack(step_logits).float().numpy()
    tts.s3gen.inference, tts.s3gen.flow_inference = s3_inference, flow_inference
    for k, case in enumerate(spec["s3gen"]):
        seen = {}

        def flow_run(*args, **kwargs):
            seen["mel"] = flow_inference(*args, **kwargs)
            return seen["mel"]

        tts.s3gen.flow_inference = flow_run
        torch.manual_seed(case["seed"])
        wave, _ = tts.s3gen.inference(speech_tokens=torch.tensor(case["tokens"]), ref_dict=tts.conds.gen)
        out[f"s3gen.{k}.mel"] = seen["mel"][0].numpy()
        out[f"s3gen.{k}.wave"] = wave[0].numpy()
    for c, case in enumerate(spec.get("clone", [])):
        clone(tts, dict(case), f"clone.{c}.", out, t3_inference, s3_inference, flow_inference)
    np.savez(out_path, **out)


def clone(tts, case: dict, key: str, out: dict, t3_inference, s3_inference, flow_inference) -> None:
    import librosa
    import torchaudio

    from chatterbox.models.s3gen.const import S3GEN_SR
    from chatterbox.models.s3tokenizer import S3_SR

    wav, seed, max_new, text = case.pop("wav"), case.pop("seed"), case.pop("max_new_tokens"), case.pop("text")
    seen = {}

    def t3_run(**kwargs):
        seen["tokens"] = t3_inference(**{**kwargs, "max_new_tokens": max_new})
        return seen["tokens"]

    def s3_run(*args, **kwargs):
        torch.manual_seed(seed)
        seen["wave"] = s3_inference(*args, **kwargs)[0].clone()
        return seen["wave"], None

    tts.t3.inference, tts.s3gen.inference, tts.s3gen.flow_inference = t3_run, s3_run, flow_inference
    torch.manual_seed(seed)
    tts.generate(text, audio_prompt_path=wav, **case)
    out[key + "tokens"], out[key + "wave"] = seen["tokens"][0].numpy(), seen["wave"][0].numpy()
    for name in ("prompt_token", "prompt_feat", "embedding"):
        out[key + name] = tts.conds.gen[name][0].detach().numpy()
    out[key + "speaker_emb"] = tts.conds.t3.speaker_emb[0].numpy()
    out[key + "prompt_tokens"] = tts.conds.t3.cond_prompt_speech_tokens[0].numpy()
    wav24, _ = librosa.load(wav, sr=S3GEN_SR)
    out[key + "wav24"] = wav24
    out[key + "wav16"] = librosa.resample(wav24, orig_sr=S3GEN_SR, target_sr=S3_SR)
    # T3's conditioning from the torchaudio-resampled clip, as prepare_conditionals computes it from librosa's
    wav16 = torchaudio.transforms.Resample(S3GEN_SR, S3_SR)(torch.from_numpy(wav24)).numpy()
    tokens, _ = tts.s3gen.tokenizer.forward([wav16[:tts.ENC_COND_LEN]], max_len=tts.t3.hp.speech_cond_prompt_len)
    out[key + "sinc.wav16"] = wav16
    out[key + "sinc.prompt_tokens"] = torch.atleast_2d(tokens)[0].numpy()
    out[key + "sinc.speaker_emb"] = tts.ve.embeds_from_wavs([wav16], sample_rate=S3_SR).mean(axis=0)


if __name__ == "__main__":
    main(*sys.argv[1:])
