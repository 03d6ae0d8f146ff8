"""Reference outputs of the official `omnivoice` package for an OmniVoice folder, written to an .npz.

Runs in the separate reference environment (.venv-omnivoice: omnivoice 0.2.1), never imported by the
test suite: tests/test_tts_omnivoice.py executes it as a subprocess.

    python tests/ref/omnivoice_ref.py SPEC.json FOLDER OUT.npz

SPEC: {"cases": [{"text", "instruct", "speed", "seed", "class_temperature", "num_step",
                  "ref_audio" (a file path), "ref_text"}...],
       "estimate": [texts], "instructs": [[description, text]...], "silence_waves": path of an .npy [K, N]}
For each case i, with torch.manual_seed(seed) before `generate` (postprocess_output=False: no silence
removal): the prompt ids the package builds, its target length, the codes its decode loop returns,
the codec's waveform for them, generate's final waveform, and that waveform post-processed the
default way (with silence removal). Also: each "silence_waves" row through the package's
remove_silence, the duration estimate of each "estimate" text, each "instructs" description resolved
(or its error), and what loading the folder left missing or unexpected. A case with "ref_audio" clones
that file's voice (generate's ref_audio + ref_text): also its reference codes, the reference's RMS and
transcript as the package keeps them (create_voice_clone_prompt), and the post-processed waveform.
"""
from __future__ import annotations

import json
import logging
import sys
import warnings

import numpy as np
import torch


def main(spec_path: str, folder: str, out_path: str) -> None:
    warnings.filterwarnings("ignore")
    from omnivoice import OmniVoice
    from omnivoice.models import omnivoice as ov
    from omnivoice.utils.audio import remove_silence
    from transformers import HiggsAudioV2TokenizerModel

    spec = json.loads(open(spec_path).read())
    model = OmniVoice.from_pretrained(folder, dtype=torch.float32)
    logging.disable(logging.WARNING)
    out: dict[str, np.ndarray] = {}
    _, info = OmniVoice.from_pretrained(folder, dtype=torch.float32, train=True, output_loading_info=True)
    _, codec_info = HiggsAudioV2TokenizerModel.from_pretrained(f"{folder}/audio_tokenizer", output_loading_info=True)
    out["load_problems"] = np.array(json.dumps({k: sorted(v) for i in (info, codec_info) for k, v in i.items()
                                                if k in ("missing_keys", "unexpected_keys") and v}))
    out["attn_implementation"] = np.array(model.llm.config._attn_implementation)
    out["sample_rate"] = np.asarray(model.sampling_rate)

    captured = {}
    original_prepare, original_iterative = model._prepare_inference_inputs, model._generate_iterative

    def prepare(*args, **kwargs):
        result = original_prepare(*args, **kwargs)
        captured["ids"] = result["input_ids"][0, 0].clone()
        return result

    def iterative(task, config):
        captured["target"] = list(task.target_lens)
        captured["codes"] = original_iterative(task, config)
        return captured["codes"]

    original_clone = model.create_voice_clone_prompt

    def clone(*args, **kwargs):
        captured["clone"] = original_clone(*args, **kwargs)
        return captured["clone"]

    model._prepare_inference_inputs, model._generate_iterative = prepare, iterative
    model.create_voice_clone_prompt = clone
    for i, case in enumerate(spec["cases"]):
        captured.pop("clone", None)
        torch.manual_seed(case["seed"])
        (wave,) = model.generate(case["text"], instruct=case.get("instruct"), speed=case.get("speed"),
                                 num_step=case.get("num_step", 32),
                                 class_temperature=case.get("class_temperature", 0.0),
                                 ref_audio=case.get("ref_audio"), ref_text=case.get("ref_text"),
                                 postprocess_output=False)
        codes = captured["codes"][0]
        ref_frames = 0
        if "clone" in captured:
            prompt = captured["clone"]
            ref_frames = prompt.ref_audio_tokens.shape[-1]
            out[f"{i}.ref_codes"] = prompt.ref_audio_tokens.numpy()
            out[f"{i}.ref_rms"] = np.asarray(prompt.ref_rms)
            out[f"{i}.ref_text"] = np.array(prompt.ref_text)
        out[f"{i}.prompt"] = captured["ids"][:-(codes.shape[1] + ref_frames)].numpy()
        out[f"{i}.frames"] = np.asarray(captured["target"][0])
        out[f"{i}.codes"] = codes.numpy()
        with torch.no_grad():
            out[f"{i}.decoded"] = model.audio_tokenizer.decode(codes[None]).audio_values[0, 0].numpy()
        out[f"{i}.wave"] = np.asarray(wave, dtype=np.float32)
        rms = captured["clone"].ref_rms if "clone" in captured else None
        trimmed = model._post_process_audio(out[f"{i}.decoded"][None], rms,
                                            ov.OmniVoiceGenerationConfig(postprocess_output=True))
        out[f"{i}.trimmed"] = trimmed[0].astype(np.float32)
    for k, wave in enumerate(np.load(spec["silence_waves"]) if spec.get("silence_waves") else []):
        out[f"silence.{k}"] = remove_silence(wave[None], int(model.sampling_rate), mid_sil=500, lead_sil=100,
                                             trail_sil=100)[0]
    out["estimate"] = np.asarray([model._estimate_target_tokens(t, None, None) for t in spec["estimate"]])
    resolved = []
    for description, text in spec["instructs"]:
        try:
            resolved.append(ov._resolve_instruct(description, use_zh=bool(ov._ZH_RE.search(text))))
        except ValueError:
            resolved.append("<error>")
    out["instructs"] = np.array(json.dumps(resolved, ensure_ascii=False))
    np.savez(out_path, **out)


if __name__ == "__main__":
    main(*sys.argv[1:])
