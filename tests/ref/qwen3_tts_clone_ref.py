"""Reference voice-clone outputs of the official `qwen-tts` package for a Qwen3-TTS Base folder.

Runs in the reference environment (.venv-qwentts), as a subprocess of tests/test_tts_qwen3_clone.py:

    python tests/ref/qwen3_tts_clone_ref.py SPEC.json CLIPS.npz FOLDER OUT.npz

CLIPS: reference clips "0", "1", ... (24 kHz mono float32). SPEC: {"cases": [{"text", "language", "ref",
"ref_text" (null: x-vector only), "non_streaming"}...], "max_new_tokens": M}.
Per clip r: librosa's mel filters ("mel_basis"), the package's log-mel ("r.mel"), x-vector ("r.xvec")
and speech tokenizer codes ("r.codes"), through `create_voice_clone_prompt`. Per case i: the text and
transcript token ids, the prefill embeddings and text stream handed to the talker, the greedy frames
and the waveform of `generate_voice_clone(do_sample=False, subtalker_dosample=False)`.
"""
from __future__ import annotations

import json
import sys
import warnings

import numpy as np
import torch


def main(spec_path: str, clips_path: str, folder: str, out_path: str) -> None:
    warnings.filterwarnings("ignore")
    from librosa.filters import mel as librosa_mel
    from qwen_tts import Qwen3TTSModel
    from qwen_tts.core.models.modeling_qwen3_tts import mel_spectrogram

    spec = json.loads(open(spec_path).read())
    clips = np.load(clips_path)
    torch.manual_seed(0)
    tts = Qwen3TTSModel.from_pretrained(folder, dtype=torch.float32)
    model = tts.model.eval()
    captured: dict = {}
    talker_generate, model_generate = model.talker.generate, model.generate

    def capture_talker(**kwargs):
        captured.update({k: kwargs[k] for k in ("inputs_embeds", "trailing_text_hidden", "tts_pad_embed")})
        return talker_generate(**kwargs)

    def capture_model(**kwargs):
        captured["input_ids"], captured["ref_ids"] = kwargs["input_ids"], kwargs["ref_ids"]
        codes, hidden = model_generate(**kwargs)
        captured["codes"] = codes
        return codes, hidden

    model.talker.generate, model.generate = capture_talker, capture_model
    out: dict[str, np.ndarray] = {"mel_basis": librosa_mel(sr=24000, n_fft=1024, n_mels=128, fmin=0, fmax=12000)}
    with torch.no_grad():
        for r in sorted(clips.files, key=int):
            wave = clips[r].astype(np.float32)
            item, = tts.create_voice_clone_prompt(ref_audio=(wave, 24000), ref_text="unused", x_vector_only_mode=False)
            out[f"{r}.mel"] = mel_spectrogram(torch.from_numpy(wave)[None], n_fft=1024, num_mels=128, sampling_rate=24000,
                                              hop_size=256, win_size=1024, fmin=0, fmax=12000).transpose(1, 2)[0].numpy()
            out[f"{r}.xvec"] = item.ref_spk_embedding.numpy()
            out[f"{r}.codes"] = item.ref_code.numpy()
        for i, case in enumerate(spec["cases"]):
            r, ref_text = str(case["ref"]), case.get("ref_text")
            wave = clips[r].astype(np.float32)
            items = tts.create_voice_clone_prompt(ref_audio=(wave, 24000), ref_text=ref_text,
                                                  x_vector_only_mode=ref_text is None)
            captured.clear()
            wavs, sr = tts.generate_voice_clone(case["text"], case["language"], voice_clone_prompt=items,
                                                non_streaming_mode=case["non_streaming"], do_sample=False,
                                                subtalker_dosample=False, max_new_tokens=spec["max_new_tokens"],
                                                repetition_penalty=1.05)
            out[f"case{i}.ids"] = captured["input_ids"][0][0].numpy()
            ref_ids = captured["ref_ids"][0]
            out[f"case{i}.ref_ids"] = (ref_ids[0] if ref_ids is not None else torch.zeros(0, dtype=torch.long)).numpy()
            out[f"case{i}.embeds"] = captured["inputs_embeds"][0].numpy()
            out[f"case{i}.trailing"] = captured["trailing_text_hidden"][0].numpy()
            out[f"case{i}.pad"] = captured["tts_pad_embed"].reshape(-1).numpy()
            out[f"case{i}.frames"] = captured["codes"][0].numpy()
            out[f"case{i}.wave"] = np.asarray(wavs[0], dtype=np.float32)
            out["sample_rate"] = np.asarray(sr)
    np.savez(out_path, **out)


if __name__ == "__main__":
    main(*sys.argv[1:])
