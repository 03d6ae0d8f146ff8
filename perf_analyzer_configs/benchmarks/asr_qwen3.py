"""Qwen3-ASR's part of bench_asr.py: its checkpoint of the release's shape (random weights) and its three
modes. Every mode decodes exactly `tokens` tokens a request (random weights would end anywhere): ours by
the pre step's min_new_tokens = max_new_tokens, transformers' by min_new_tokens = max_new_tokens.

server: c requests at once, each on its own gRPC stream with stream=true; first text = the first
response with text (a streamed token), the time to first transcript delta.
inprocess: the ensemble's steps built from ensemble_configs/qwen3_asr.yaml: pre for each request, the
encoder on the c requests together, asr_decode (its engine and delivery threads) with every request
submitted at once, the post step on each final response; first text = the first streamed token.
baseline: Qwen3ASRProcessor on the c clips (one padded batch) + Qwen3ASRForConditionalGeneration.generate
(greedy, eager) + batch_decode; first text = its latency (generate answers at the end).
"""
from __future__ import annotations

import json
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import torch

from triton_omni.runtime.step import Request, ResponseSink

RATE = 16000
# Qwen/Qwen3-ASR-1.7B: the audio encoder (24 layers of 1024, 1 s conv chunks, 8 s attention windows) and
# a Qwen3-1.7B decoder (28 layers of 2048, 16 heads, 8 KV heads, tied embeddings)
SHAPES = {
    "1.7b": (dict(num_mel_bins=128, d_model=1024, encoder_layers=24, encoder_attention_heads=16, encoder_ffn_dim=4096,
                  downsample_hidden_size=480, output_dim=2048, n_window=50, n_window_infer=800),
             dict(hidden_size=2048, intermediate_size=6144, num_hidden_layers=28, num_attention_heads=16,
                  num_key_value_heads=8, head_dim=128, max_position_embeddings=65536, tie_word_embeddings=True,
                  vocab_size=151936, rope_parameters={"rope_type": "default", "rope_theta": 1000000.0})),
}
SPECIALS = {"<|endoftext|>": 151643, "<|im_start|>": 151644, "<|im_end|>": 151645, "<|audio_start|>": 151669,
            "<|audio_end|>": 151670, "<|audio_pad|>": 151676, "<asr_text>": 151704}


def write_checkpoint(root: Path, shape: str, device: str, dtype: torch.dtype, tiny_folder: Path | None = None) -> Path:
    """A Qwen3ASRForConditionalGeneration folder of `shape` with random weights and the processor files
    (reused when written); "tiny": the converter's tiny checkpoint."""
    if shape == "tiny":
        from triton_omni.converters.tiny import build

        return build(root, ["qwen3_asr"])["qwen3_asr"]
    from transformers import Qwen3ASRConfig, Qwen3ASRForConditionalGeneration

    from triton_omni.converters.tiny_asr import QWEN3_ASR_TEMPLATE
    from triton_omni.converters.tiny_common import synthetic_tokenizer

    folder = root / f"qwen3-asr-{shape}"
    if (folder / "model.safetensors").exists() or (folder / "model.safetensors.index.json").exists():
        return folder
    audio, text = SHAPES[shape]
    config = Qwen3ASRConfig(audio_config=audio, text_config=text, audio_token_id=SPECIALS["<|audio_pad|>"],
                            eos_token_id=[SPECIALS["<|endoftext|>"], SPECIALS["<|im_end|>"]],
                            pad_token_id=SPECIALS["<|im_end|>"])
    torch.manual_seed(0)
    with torch.device(device):
        model = Qwen3ASRForConditionalGeneration(config).to(dtype)
    model.save_pretrained(str(folder))
    del model
    synthetic_tokenizer(folder, text["vocab_size"], SPECIALS)
    # what Qwen3ASRProcessor reads: the audio tokens by name, the chat template, the feature extractor
    meta = json.loads((folder / "tokenizer_config.json").read_text())
    meta["extra_special_tokens"] = {"audio_token": "<|audio_pad|>", "audio_bos_token": "<|audio_start|>",
                                    "audio_eos_token": "<|audio_end|>"}
    (folder / "tokenizer_config.json").write_text(json.dumps(meta, indent=2))
    (folder / "chat_template.jinja").write_text(QWEN3_ASR_TEMPLATE)
    from transformers import Qwen3ASRFeatureExtractor

    Qwen3ASRFeatureExtractor().save_pretrained(str(folder))
    return folder


def overrides(tokens: int, c_max: int) -> list[str]:
    return ["qwen3_asr.pre.segmentation=window", f"qwen3_asr.pre.max_new_tokens={tokens}",
            f"qwen3_asr.pre.min_new_tokens={tokens}", f"qwen3_asr.max_batch_size={max(32, c_max)}"]


def server_mode(ctx):
    from triton_omni.client.tensors import text
    from triton_omni.client.transcribe import TranscribeClient

    from perf_analyzer_configs.benchmarks.common import start_server

    server = start_server("qwen3_asr", ctx.folder, ctx.overrides, Path(ctx.args.workdir), ctx.target)
    client = TranscribeClient(server.grpc_url, timeout_s=600)

    def one(i, t0):
        first = None
        for out in client.responses("qwen3_asr", ctx.files[i % len(ctx.files)], stream=True, language="en"):
            first = first or (time.perf_counter() if text(out, "text") else None)
        end = time.perf_counter()
        return {"first": (first or end) - t0, "latency": end - t0}

    def go(c):
        t0 = time.perf_counter()
        with ThreadPoolExecutor(c) as pool:
            per = list(pool.map(lambda i: one(i, t0), range(c)))
        return time.perf_counter() - t0, per

    return go, server.stop


class Collect(ResponseSink):
    """One request's responses from asr_decode, with the time of its first text token and of its end."""

    def __init__(self, t0: float):
        self.t0, self.first, self.outputs, self.done = t0, None, [], threading.Event()

    def send(self, outputs, final=False):
        ids = np.asarray(outputs.get("token_ids", [])).reshape(-1)
        if self.first is None and ids.size > int(np.asarray(outputs.get("num_context", [0])).reshape(-1)[0]):
            self.first = time.perf_counter() - self.t0
        self.outputs.append(outputs)
        if final:
            self.end = time.perf_counter() - self.t0
            self.done.set()

    def error(self, exc):
        self.outputs.append(exc)
        self.end = time.perf_counter() - self.t0
        self.done.set()


def inprocess_mode(ctx):
    from perf_analyzer_configs.benchmarks.bench_asr import build_steps, ok

    steps = build_steps(ctx, "qwen3_asr")

    def go(c):
        t0 = time.perf_counter()
        pre = [ok(steps["pre"].execute([Request({"audio": np.array([ctx.files[i % len(ctx.files)]], dtype=object),
                                                 "language": np.array([b"en"], dtype=object),
                                                 "stream": np.array([True])})]))[0] for i in range(c)]
        embeds = ok(steps["encoder"].execute([Request(p) for p in pre]))
        sinks = [Collect(t0) for _ in range(c)]
        for p, e, sink in zip(pre, embeds, sinks):
            steps["ar"].submit(Request({**p, **e, "stream": np.array([True])}), sink)
        for sink in sinks:
            sink.done.wait(600)
        for p, sink in zip(pre, sinks):
            final = sink.outputs[-1]
            if isinstance(final, BaseException):
                raise final
            ok(steps["post"].execute([Request({**p, **final})]))
        wall = time.perf_counter() - t0
        return wall, [{"first": s.first or s.end, "latency": s.end} for s in sinks]

    def close():
        for step in steps.values():
            step.close()

    return go, close


def baseline_mode(ctx):
    from transformers import AutoProcessor, Qwen3ASRForConditionalGeneration

    from triton_omni.media.audio import decode

    model = Qwen3ASRForConditionalGeneration.from_pretrained(str(ctx.folder), dtype=ctx.dtype,
                                                             attn_implementation=ctx.args.hf_attention)
    model = model.to(ctx.device).eval()
    processor = AutoProcessor.from_pretrained(str(ctx.folder))
    tokens = ctx.args.tokens

    @torch.inference_mode()
    def go(c):
        from perf_analyzer_configs.benchmarks.bench_asr import sync

        t0 = time.perf_counter()
        waves = [decode(ctx.files[i % len(ctx.files)], RATE)[0] for i in range(c)]
        inputs = processor.apply_transcription_request(waves, language="en").to(ctx.device)
        inputs["input_features"] = inputs["input_features"].to(ctx.dtype)
        ids = model.generate(**inputs, max_new_tokens=tokens, min_new_tokens=tokens, do_sample=False)
        texts = processor.batch_decode(ids[:, inputs["input_ids"].shape[1]:].cpu().tolist(), skip_special_tokens=True)
        sync()
        wall = time.perf_counter() - t0
        assert len(texts) == c
        return wall, [{"first": wall, "latency": wall}] * c

    return go, lambda: None


MODE_FNS = {"server": server_mode, "inprocess": inprocess_mode, "baseline": baseline_mode}
