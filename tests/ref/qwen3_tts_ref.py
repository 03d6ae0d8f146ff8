"""Reference outputs of the official `qwen-tts` package for a Qwen3-TTS folder, written to an .npz.

Runs in the separate reference environment (.venv-qwentts: qwen-tts 0.1.1 with transformers 4.57.3),
never imported by the test suite: tests/test_tts_qwen3.py executes it as a subprocess.

    python tests/ref/qwen3_tts_ref.py SPEC.json FOLDER OUT.npz [FOLDER OUT.npz ...]

SPEC: {"cases": [{"text", "language", "speaker", "instruct", "non_streaming"}...], "max_new_tokens": M,
       "batch": [case indices generated together], "codes": {name: [[frame codes]...] or null padding}}
For each case i: the token ids (the package's processor), the prefill embeddings and text stream the
package hands its talker (captured from `talker.generate`), the talker's logits over the prompt, the
greedy frames of `generate(do_sample=False, subtalker_dosample=False)` with the release's repetition
penalty, the talker hidden state per frame and the predictor's teacher-forced logits for those frames,
and the package's waveform for those frames. "batch": the same cases generated in one batch (left
padding, as the package batches). "codes": the speech tokenizer's decode of given code arrays.
"""
from __future__ import annotations

import json
import sys
import warnings

import numpy as np
import torch


def main(spec_path: str, *pairs: str) -> None:
    warnings.filterwarnings("ignore")
    spec = json.loads(open(spec_path).read())
    for folder, out_path in zip(pairs[::2], pairs[1::2]):
        run(spec, folder, out_path)


def run(spec: dict, folder: str, out_path: str) -> None:
    from qwen_tts import Qwen3TTSModel

    torch.manual_seed(0)
    tts = Qwen3TTSModel.from_pretrained(folder, dtype=torch.float32)
    model = tts.model.eval()
    talker = model.talker
    captured = []
    original = talker.generate

    def capture(**kwargs):
        captured.append({k: kwargs[k] for k in ("inputs_embeds", "attention_mask", "trailing_text_hidden",
                                               "tts_pad_embed")})
        return original(**kwargs)

    talker.generate = capture
    out: dict[str, np.ndarray] = {}
    gen = dict(do_sample=False, subtalker_dosample=False, max_new_tokens=spec["max_new_tokens"],
               repetition_penalty=spec.get("repetition_penalty", 1.05))

    def inputs(case):
        ids = tts._tokenize_texts([tts._build_assistant_text(case["text"])])[0]
        instruct = case.get("instruct") or ""
        instruct_ids = tts._tokenize_texts([tts._build_instruct_text(instruct)])[0] if instruct else None
        return ids, instruct_ids

    with torch.no_grad():
        for i, case in enumerate(spec["cases"]):
            ids, instruct_ids = inputs(case)
            captured.clear()
            codes, hiddens = model.generate(input_ids=[ids], instruct_ids=[instruct_ids], languages=[case["language"]],
                                            speakers=[case.get("speaker")], non_streaming_mode=case["non_streaming"],
                                            **gen)
            c = captured[0]
            embeds = c["inputs_embeds"]
            logits = talker(inputs_embeds=embeds, attention_mask=torch.ones(embeds.shape[:2], dtype=torch.long),
                            use_cache=False).logits
            out[f"{i}.ids"] = ids[0].numpy()
            out[f"{i}.instruct_ids"] = (instruct_ids[0] if instruct_ids is not None else torch.zeros(0, dtype=torch.long)).numpy()
            out[f"{i}.embeds"] = embeds[0].numpy()
            out[f"{i}.trailing"] = c["trailing_text_hidden"][0].numpy()
            out[f"{i}.pad"] = c["tts_pad_embed"].reshape(-1).numpy()
            out[f"{i}.logits"] = logits[0].float().numpy()
            out[f"{i}.codes"] = codes[0].numpy()
            out[f"{i}.hidden"] = hiddens[0].numpy()
            if codes[0].shape[0]:
                sub, _ = talker.forward_sub_talker_finetune(codes[0], hiddens[0])
                out[f"{i}.predictor_logits"] = sub.numpy()
            wavs, sr = model.speech_tokenizer.decode([{"audio_codes": codes[0]}])
            out[f"{i}.wave"] = np.asarray(wavs[0], dtype=np.float32)
            out["sample_rate"] = np.asarray(sr)
        batch = spec.get("batch") or []
        if batch:
            cases = [spec["cases"][i] for i in batch]
            pairs = [inputs(c) for c in cases]
            codes, _ = model.generate(input_ids=[p[0] for p in pairs], instruct_ids=[p[1] for p in pairs],
                                      languages=[c["language"] for c in cases], speakers=[c.get("speaker") for c in cases],
                                      non_streaming_mode=cases[0]["non_streaming"], **gen)
            for j, c in enumerate(codes):
                out[f"batch.{j}.codes"] = c.numpy()
        for name, arrays in (spec.get("codes") or {}).items():
            wavs, _ = model.speech_tokenizer.decode([{"audio_codes": torch.tensor(a, dtype=torch.long)} for a in arrays])
            for j, w in enumerate(wavs):
                out[f"codec.{name}.{j}"] = np.asarray(w, dtype=np.float32)
    np.savez(out_path, **out)


if __name__ == "__main__":
    main(*sys.argv[1:])
