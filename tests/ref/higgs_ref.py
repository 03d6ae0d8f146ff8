"""Higgs Audio understanding by the boson-multimodal package (run in .venv-higgs by tests/test_asr_higgs.py).

argv: spec.json (clips: lists of 16 kHz samples; instruction; steps), the checkpoint folder, out.npz.
Writes per clip i: `prompt{i}` (the package's prompt ids: prepare_chatml_sample of a user turn [instruction,
audio], then the assistant header), `embeds{i}` (its audio tower + projector on the clip, padded to 30 s by
the Whisper feature extractor as the package's collator does), `logits{i}` (the text logits of the next
token after the prompt) and `tokens{i}` (greedy tokens, each step a full forward: no cache to go wrong).
"""
import json
import sys

import numpy as np
import torch
from boson_multimodal.data_types import AudioContent, ChatMLSample, Message, TextContent
from boson_multimodal.dataset.chatml_dataset import prepare_chatml_sample
from boson_multimodal.model.higgs_audio import HiggsAudioModel
from transformers import AutoTokenizer, WhisperFeatureExtractor

spec = json.load(open(sys.argv[1]))
folder = sys.argv[2]
model = HiggsAudioModel.from_pretrained(folder).eval()
tok = AutoTokenizer.from_pretrained(folder)
fe = WhisperFeatureExtractor(feature_size=model.config.audio_encoder_config.num_mel_bins)
stops = set(json.load(open(f"{folder}/generation_config.json"))["eos_token_id"])
out = {}
for i, clip in enumerate(spec["clips"]):
    clip = np.asarray(clip, dtype=np.float32)
    sample = ChatMLSample(messages=[Message(role="user", content=[TextContent(text=spec["instruction"]),
                                                                  AudioContent(audio_url="")])])
    ids, _, _, _ = prepare_chatml_sample(sample, tok)
    ids = ids + tok.encode("<|start_header_id|>assistant<|end_header_id|>\n\n", add_special_tokens=False)
    f = fe(clip, sampling_rate=16000, return_attention_mask=True, padding="max_length", return_tensors="pt")
    with torch.no_grad():
        emb, n = model._apply_audio_tower(f["input_features"], f["attention_mask"])
        seq, tokens, first = list(ids), [], None
        for _ in range(spec["steps"]):
            o = model(input_ids=torch.tensor([seq]), attention_mask=torch.ones(1, len(seq), dtype=torch.bool),
                      audio_features=f["input_features"], audio_feature_attention_mask=f["attention_mask"],
                      use_cache=False)
            logits = o.logits[0, -1]
            first = logits.numpy() if first is None else first
            t = int(logits.argmax())
            if t in stops:
                break
            tokens.append(t)
            seq.append(t)
    out[f"prompt{i}"] = np.asarray(ids)
    out[f"embeds{i}"] = emb[0, :int(n[0])].numpy()
    out[f"logits{i}"] = first
    out[f"tokens{i}"] = np.asarray(tokens, dtype=np.int64)
np.savez(sys.argv[3], **out)
