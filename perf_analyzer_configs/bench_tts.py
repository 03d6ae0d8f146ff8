"""Speech synthesis benchmark: time to first audio (TTFA), real-time factor (RTF) and audio seconds per
second of our TTS ensembles behind tritonserver (gRPC streaming), of their steps called in-process, and
of the reference code (baseline), on the released shapes with random weights, in one run on one GPU.

    python perf_analyzer_configs/bench_tts.py                                    # on the GPU machine
    python perf_analyzer_configs/bench_tts.py --smoke --out /tmp/tts_smoke.json  # tiny shapes, CPU check
    python perf_analyzer_configs/bench_tts.py --models kokoro_tts --out r2.json  # a part; then --merge r1.json r2.json

orpheus_tts  canopylabs/orpheus-3b-0.1-ft (Llama-3.2-3B talker) + hubertsiuzdak/snac_24khz. baseline: transformers
             LlamaForCausalLM.generate (static cache, a batch of c) + `snac` SNAC.decode of those tokens.
kokoro_tts   hexgrad/Kokoro-82M. baseline: the `kokoro` package's KModel forward, one utterance per call.
qwen3_tts    Qwen/Qwen3-TTS-12Hz-0.6B-CustomVoice (28-layer talker + 5-layer code predictor, 16 codebooks at
             12.5 Hz) + its speech tokenizer's decoder. baseline: the `qwen-tts` package's generate_custom_voice
             (c texts in one call) in its own environment (--package-python; transformers 4.57.3), driven
             through perf_analyzer_configs/bench_tts_qwen3_package.py.
inprocess: the ensemble's steps built from ensemble_configs/<model>.yaml with the server's parameters, fed
as Triton batches them. Modes run in the order server, inprocess, baseline: the server's processes free
the GPU when they stop; what in-process leaves fits in the 15% gpu_memory_utilization keeps free.

Workload: a fixed 25-word text (Kokoro: its phonemes, below); Orpheus makes exactly --audio-tokens tokens
(min_tokens = max_tokens, EOS ignored; 616 = 88 SNAC frames = 7.5 s) at the release's temperature 0.6 /
top_p 0.8; Qwen3-TTS exactly --audio-frames frames (100 = 8 s) at the release's sampling (temperature
0.9, top-k 50, repetition penalty 1.05, the code predictor likewise), voice vivian; seeds fixed. Weights are written once under --workdir; every mode loads the same files.
TTFA: request sent -> first non-empty PCM chunk received. Baselines do not stream: Orpheus' TTFA is
generating the tokens of the ensemble's first chunk (2 frames + 3 lookahead) + their SNAC decode;
Kokoro's is the whole utterance; Qwen3-TTS's is generating and decoding the frames of the ensemble's
first chunk (3). RTF: latency / audio seconds. Audio s/s: all requests' audio seconds
/ wall time. c requests at once, --repeats rounds per row after a warm-up (c=1, then the largest c).

Wheels beyond torch / transformers / tritonclient / nvidia-pytriton: `snac` (+ einops; any Orpheus mode:
the codec checkpoint is written by converters/tiny_tts.snac_24khz with it; and the baseline), `kokoro==0.9.4
--no-deps` + `loguru` (+ attrs; Kokoro baseline only). Not PyAV (`av`): streamed responses are raw PCM
(media/audio.pcm_bytes); av is imported only to encode files (wav, mp3, ...), never asked for here.
Not espeak-ng: Kokoro requests carry phonemes. The qwen3_tts baseline's environment: qwen-tts 0.1.1,
transformers 4.57.3, accelerate, huggingface_hub<1 (the package's other imports are stubbed, see
bench_tts_qwen3_package.py); e.g. `pip install --no-deps --target DIR <those wheels>` and
`--package-python "env PYTHONPATH=DIR python3"`.
"""
from __future__ import annotations

import argparse
import datetime
import gc
import importlib.metadata
import json
import platform
import queue
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402
import torch  # noqa: E402

from triton_omni.converters.tiny_tts import KOKORO_TINY_CONFIG, KOKORO_VOCAB, SNAC_TINY_CONFIG, snac_24khz  # noqa: E402
from perf_analyzer_configs.bench_ar_decode import percentile  # noqa: E402
from perf_analyzer_configs.merge import merge_parts  # noqa: E402
from triton_omni.runtime.step import Request, ResponseSink, string_array  # noqa: E402

TEXT = ("The quick brown fox jumps over the lazy dog near the river, while seven small birds sing "
        "their morning songs in the old oak tree.")
# TEXT through python_backends/tts/kokoro_text.Phonemizer (espeak-ng 1.51, voice af_heart: en-us)
PHONEMES = ("ðə kwˈɪk bɹˈWn fˈɑks ʤˈʌmps ˌOvəɹ ðə lˈAzi dˈɑɡ nˌɪɹ ðə ɹˈɪvəɹ, wˌIl sˈɛvən smˈɔl bˈɜɹdz "
            "sˈɪŋ ðɛɹ mˈɔɹnɪŋ sˈɔŋz ɪnðɪ ˈOld ˈOk tɹˈi.")
AUDIO_CUSTOM = 10 + 7 * 4096 + 2            # Orpheus' <custom_token_N> after the text vocabulary
LLAMA3_ROPE = {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 32.0, "low_freq_factor": 1.0,
               "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}
SHAPES = {"real": {
    # canopylabs/orpheus-3b-0.1-ft config.json (Llama-3.2-3B-Instruct + 28684 audio/control tokens)
    "orpheus": dict(text_vocab=128256, hidden_size=3072, intermediate_size=8192, num_hidden_layers=28,
                    num_attention_heads=24, num_key_value_heads=8, head_dim=128, max_position_embeddings=131072,
                    rms_norm_eps=1e-5, tie_word_embeddings=True, rope_parameters=LLAMA3_ROPE),
    # hubertsiuzdak/snac_24khz config.json (19.8M parameters)
    "snac": {"sampling_rate": 24000, "encoder_dim": 48, "encoder_rates": [2, 4, 8, 8], "decoder_dim": 1024,
             "decoder_rates": [8, 8, 4, 2], "attn_window_size": None, "codebook_size": 4096, "codebook_dim": 8,
             "vq_strides": [4, 2, 1], "noise": True, "depthwise": True},
    # hexgrad/Kokoro-82M config.json (82M parameters; converters/tiny_tts.py shrinks PL-BERT, n_layer,
    # the resblocks and max_dur)
    "kokoro": {"istftnet": {"upsample_kernel_sizes": [20, 12], "upsample_rates": [10, 6], "gen_istft_hop_size": 5,
                            "gen_istft_n_fft": 20, "resblock_dilation_sizes": [[1, 3, 5], [1, 3, 5], [1, 3, 5]],
                            "resblock_kernel_sizes": [3, 7, 11], "upsample_initial_channel": 512},
               "dim_in": 64, "dropout": 0.2, "hidden_dim": 512, "max_conv_dim": 512, "max_dur": 50,
               "multispeaker": True, "n_layer": 3, "n_mels": 80, "n_token": 178, "style_dim": 128,
               "text_encoder_kernel_size": 5, "vocab": KOKORO_VOCAB,
               "plbert": {"hidden_size": 768, "num_attention_heads": 12, "intermediate_size": 2048,
                          "max_position_embeddings": 512, "num_hidden_layers": 12, "dropout": 0.1}},
}, "tiny": {
    "orpheus": dict(text_vocab=1024, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                    num_key_value_heads=2, head_dim=16, max_position_embeddings=4096, rms_norm_eps=1e-5,
                    tie_word_embeddings=True,
                    rope_parameters={**LLAMA3_ROPE, "original_max_position_embeddings": 1024}),
    "snac": SNAC_TINY_CONFIG, "kokoro": KOKORO_TINY_CONFIG}}
# Qwen/Qwen3-TTS-12Hz-0.6B-CustomVoice config.json (talker, code predictor) and Qwen3-TTS-Tokenizer-12Hz's
# decoder_config; everything else (token ids, speakers, rope sections) as converters/tiny_qwen3_tts.py writes it
QWEN3_TTS_REAL = {
    "talker": dict(hidden_size=1024, intermediate_size=3072, num_hidden_layers=28, num_attention_heads=16,
                   num_key_value_heads=8, head_dim=128, text_hidden_size=2048, text_vocab_size=151936,
                   rope_scaling={"interleaved": True, "mrope_section": [24, 20, 20], "rope_type": "default",
                                 "type": "default"}),
    "predictor": dict(hidden_size=1024, intermediate_size=3072, num_hidden_layers=5, num_attention_heads=16,
                      num_key_value_heads=8, head_dim=128, layer_types=["full_attention"] * 5),
    "decoder": dict(codebook_dim=512, hidden_size=512, head_dim=64, latent_dim=1024, num_attention_heads=16,
                    num_key_value_heads=16, sliding_window=72, intermediate_size=1024, num_hidden_layers=8,
                    decoder_dim=1536, vector_quantization_hidden_dimension=512),
}
KOKORO_DURATION_BIAS = -2.94   # 50 sigmoids ~0.06: 3 frames (75 ms) a symbol, 9.9 s for TEXT (~150 words/min)
MODES = ["server", "inprocess", "baseline"]


# --- checkpoints: the release layouts, real shapes, random weights --------------------------------
def orpheus_tokenizer(folder: Path, text_vocab: int):
    """Byte-level ids 0-255, Llama-3's specials where the release has them (128000, 128001, 128009
    for the real vocabulary), fillers up to `text_vocab`, then the <custom_token_N> tokens. One token
    per byte: TEXT's prompt is 141 tokens (Llama-3's BPE: ~35), a few ms more prefill in every mode."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    from triton_omni.converters.tiny import _byte_alphabet_index

    base = text_vocab - 256
    specials = {"<|begin_of_text|>": base, "<|end_of_text|>": base + 1, "<|eot_id|>": base + 9}
    vocab = {c: i for i, c in enumerate(sorted(pre_tokenizers.ByteLevel.alphabet(), key=_byte_alphabet_index))}
    vocab.update({**specials, **{f"t{i:x}": i for i in range(256, text_vocab) if i not in specials.values()}})
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer, tok.decoder = pre_tokenizers.ByteLevel(add_prefix_space=False), decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(s, special=True) for s in specials])
    tok.add_special_tokens([AddedToken(f"<custom_token_{i}>", special=True, normalized=False)
                            for i in range(AUDIO_CUSTOM)])
    tok.post_processor = processors.TemplateProcessing(single="<|begin_of_text|> $A",
                                                       special_tokens=[("<|begin_of_text|>", base)])
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<|begin_of_text|>", eos_token="<|eot_id|>",
                                   pad_token="<|end_of_text|>")
    assert len(fast) == text_vocab + AUDIO_CUSTOM, len(fast)
    fast.save_pretrained(str(folder))
    return fast


def write_orpheus(root: Path, shapes: str, device: str, dtype) -> tuple[Path, Path]:
    """canopylabs' layout (LlamaForCausalLM save_pretrained + tokenizer) and hubertsiuzdak/snac_24khz's."""
    from transformers import LlamaConfig, LlamaForCausalLM

    folder, codec = root / f"{shapes}-orpheus", root / f"{shapes}-snac_24khz"
    if not (codec / "pytorch_model.bin").exists():
        codec.mkdir(parents=True, exist_ok=True)
        snac_24khz(codec, SHAPES[shapes]["snac"], seed=24)
    if (folder / "generation_config.json").exists():          # written last
        return folder, codec
    shape = dict(SHAPES[shapes]["orpheus"])
    tok = orpheus_tokenizer(folder, shape.pop("text_vocab"))
    eot = tok.convert_tokens_to_ids("<|eot_id|>")
    config = LlamaConfig(vocab_size=len(tok), bos_token_id=tok.bos_token_id, eos_token_id=eot,
                         pad_token_id=tok.pad_token_id, **shape)
    torch.manual_seed(0)
    with torch.device(device):
        LlamaForCausalLM(config).to(dtype).save_pretrained(str(folder))
    gc.collect()
    torch.cuda.empty_cache() if device != "cpu" else None
    end_of_speech = tok.convert_tokens_to_ids("<custom_token_2>")
    (folder / "generation_config.json").write_text(json.dumps({"eos_token_id": [eot, end_of_speech]}))
    return folder, codec


def write_kokoro(root: Path, shapes: str) -> Path:
    """hexgrad/Kokoro-82M's layout (config.json, kokoro-v1_0.pth, voices/af_heart.pt)."""
    from triton_omni.tts.kokoro.model import WEIGHTS_FILE, Kokoro, release_state_dicts

    folder = root / f"{shapes}-kokoro"
    if (folder / WEIGHTS_FILE).exists():
        return folder
    config = SHAPES[shapes]["kokoro"]
    torch.manual_seed(82)
    model = Kokoro(config).eval()
    with torch.no_grad():
        dur = model.predictor.duration_proj["linear_layer"]
        dur.weight.mul_(0.5)
        dur.bias.fill_(KOKORO_DURATION_BIAS)
        model.predictor.F0_proj.bias.fill_(150.0)          # voiced, as speech mostly is
    (folder / "voices").mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config, indent=2, ensure_ascii=False), encoding="utf-8")
    torch.save(0.3 * torch.randn(510, 1, 256, generator=torch.Generator().manual_seed(82)),
               folder / "voices" / "af_heart.pt")
    torch.save(release_state_dicts(model), folder / WEIGHTS_FILE)
    return folder


def write_qwen3_tts(root: Path, shapes: str, device: str, dtype) -> Path:
    """The release layout (config.json, model.safetensors, tokenizer files, speech_tokenizer/) at the
    real sizes (or the tiny test checkpoint's). The tokenizer is the tiny byte-level one: its ids are a
    subset of the 151936-row text embedding, and speed does not depend on which ids a text uses."""
    from safetensors.torch import save_file

    from triton_omni.converters import tiny_qwen3_tts as tq
    from triton_omni.tts.qwen3_tts.codec import Qwen3TTSCodec
    from triton_omni.tts.qwen3_tts.model import Qwen3TTS, Qwen3TTSConfig

    folder = root / f"{shapes}-qwen3_tts"
    done = folder / ".complete"
    if done.exists():
        return folder
    folder.mkdir(parents=True, exist_ok=True)
    if shapes == "tiny":
        tq.qwen3_tts(folder)
        done.touch()
        return folder
    ids = tq.build_tokenizer(folder)
    config = tq.model_config(ids, "0b6")
    config["torch_dtype"] = "bfloat16"
    config["talker_config"].update(QWEN3_TTS_REAL["talker"])
    config["talker_config"]["code_predictor_config"].update(QWEN3_TTS_REAL["predictor"])
    torch.manual_seed(0)
    with torch.device(device):
        model = Qwen3TTS(Qwen3TTSConfig.from_dict(config))
        with torch.no_grad():
            for p in model.parameters():
                if p.dim() >= 2:                     # norms keep their ones
                    p.normal_(0.0, 0.02)
    save_file(tq.checkpoint_state(model.to(dtype)), str(folder / "model.safetensors"), metadata={"format": "pt"})
    del model
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    (folder / "generation_config.json").write_text(json.dumps(tq.GENERATION, indent=2))
    # the speech tokenizer: the real decoder (float32, as released), the tiny Mimi encoder (never used here)
    speech = folder / "speech_tokenizer"
    speech.mkdir(exist_ok=True)
    codec_config = tq.codec_config()
    codec_config["decoder_config"] = {**tq.DECODER_CONFIG, **QWEN3_TTS_REAL["decoder"]}
    codec = Qwen3TTSCodec(codec_config)
    tq._randomize_codec(codec, 1212)
    state = tq.checkpoint_state(codec)
    g = torch.Generator().manual_seed(1213)
    dim = codec_config["decoder_config"]["codebook_dim"]
    for part in ("rvq_first", "rvq_rest"):
        state[f"decoder.quantizer.{part}.input_proj.weight"] = torch.randn(dim // 2, dim, 1, generator=g) / dim ** 0.5
    state.update(tq.mimi_encoder_state(1214))
    save_file(state, str(speech / "model.safetensors"), metadata={"format": "pt"})
    (speech / "config.json").write_text(json.dumps(codec_config, indent=2))
    (speech / "preprocessor_config.json").write_text(json.dumps(tq.PREPROCESSOR, indent=2))
    gc.collect()
    torch.cuda.empty_cache() if device != "cpu" else None
    done.touch()
    return folder


# --- measuring --------------------------------------------------------------------------------------
def summarize(model, mode, c, rounds) -> dict:
    """rounds: [(wall_s, [{"ttfa", "latency", "audio_s"} per request])]."""
    per = [r for _, p in rounds for r in p]
    ttfa, rtf, lat = ([r["ttfa"] for r in per], [r["latency"] / r["audio_s"] for r in per],
                      [r["latency"] for r in per])
    return {"model": model, "mode": mode, "concurrency": c, "requests": len(per),
            "audio_s": statistics.median(r["audio_s"] for r in per),
            "ttfa_ms_p50": 1e3 * statistics.median(ttfa), "ttfa_ms_p90": 1e3 * percentile(ttfa, 0.9),
            "latency_ms_p50": 1e3 * statistics.median(lat), "rtf_p50": statistics.median(rtf),
            "rtf_p90": percentile(rtf, 0.9),
            "audio_s_per_s": sum(r["audio_s"] for r in per) / sum(w for w, _ in rounds)}


def sampling(ctx, i: int) -> dict:
    if ctx.name == "kokoro_tts":
        return {"seed": 1000 + i}
    n = ctx.args.audio_frames if ctx.name == "qwen3_tts" else ctx.args.audio_tokens
    return {"seed": 1000 + i, "max_tokens": n, "min_tokens": n, "ignore_eos": True}


class Sink(ResponseSink):
    """A decoupled step's responses to `put(outputs, final)`."""

    def __init__(self, put):
        self.send, self.error = put, lambda exc: put(exc, True)


def ok(results):
    for r in results:
        if isinstance(r, BaseException):
            raise r
    return results


# --- modes: each returns go(c) -> (wall, per-request dicts), and close() ---------------------------
def server_mode(ctx):
    from triton_omni.client.speech import SpeechClient
    from triton_omni.client.tensors import first, text
    from triton_omni.client.triton import responses
    from triton_omni.converters.__main__ import load_configs
    from triton_omni.converters.generate import write_repository
    from triton_omni.launcher.triton import TritonServer

    repo = Path(ctx.args.workdir) / f"repository-{ctx.name}"
    write_repository(load_configs([ctx.name], [f"{ctx.name}={ctx.folder}"], ctx.overrides), repo, ctx.target)
    server = TritonServer(repo, models=[ctx.name], log_path=Path(ctx.args.workdir) / f"server-{ctx.name}.log",
                          extra_args=list(ctx.args.server_arg))
    server.start(timeout=1800)

    def one(i, t0):
        values = SpeechClient.values(TEXT, voice=ctx.voice, response_format="pcm", stream=True,
                                     sampling=sampling(ctx, i))
        if ctx.name == "kokoro_tts":
            values["phonemes"] = (PHONEMES, "BYTES")
        got, nbytes, rate = None, 0, 0
        for out in responses(server.grpc_url, ctx.name, values, 600, last=lambda o: bool(text(o, "finish_reason"))):
            audio = first(out, "audio", b"")
            got = got or (time.perf_counter() if audio else None)
            nbytes, rate = nbytes + len(audio), int(first(out, "sample_rate", 0)) or rate
        return {"ttfa": got - t0, "latency": time.perf_counter() - t0, "audio_s": nbytes / 2 / rate}

    def go(c):                              # c requests at once, each on its own gRPC stream
        t0 = time.perf_counter()
        with ThreadPoolExecutor(c) as pool:
            results = list(pool.map(lambda i: one(i, t0), range(c)))
        return time.perf_counter() - t0, results

    def close():
        try:
            if ctx.args.server_stats:    # where a request's time went, per step (Triton's statistics API)
                print_server_stats(server)
        finally:
            server.stop()

    return go, close


def print_server_stats(server) -> None:
    """Each loaded model's Triton statistics, per execution (STATS lines on stdout)."""
    import urllib.request

    stats = json.loads(urllib.request.urlopen(f"http://{server.http_url}/v2/models/stats").read())
    for m in stats.get("model_stats", []):
        n, s = int(m.get("execution_count", 0)), m["inference_stats"]
        if n:
            print("STATS " + json.dumps({"model": m["name"], "executions": n, "inferences": int(m.get("inference_count", 0)),
                                         **{f"{k}_ms_per_exec": int(s[k]["ns"]) / n / 1e6
                                            for k in ("queue", "compute_input", "compute_infer", "compute_output")}}),
                  flush=True)


def build_steps(ctx) -> tuple[dict, int]:
    """The ensemble's steps, with the parameters the server gives them on this target."""
    from triton_omni.converters.__main__ import load_configs
    from triton_omni.runtime.params import parse_params
    from triton_omni.runtime.step import StepContext

    cfg = load_configs([ctx.name], [f"{ctx.name}={ctx.folder}"], ctx.overrides)[0]
    return {s.key: s.cls(StepContext(model_name=cfg.model_name(s), max_batch_size=cfg.max_batch_size, base_dir=ROOT,
                                     params=parse_params(s.cls.Params, cfg.resolved_parameters(s, ctx.target)),
                                     device=ctx.device if s.kind == "gpu" else "cpu"))
            for s in cfg.steps}, cfg.max_batch_size


def speech_request(ctx, i: int) -> Request:
    tensors = {"text": string_array(TEXT), "voice": string_array(ctx.voice), "response_format": string_array("pcm"),
               "stream": np.array([True]), "sampling_parameters": string_array(json.dumps(sampling(ctx, i)))}
    if ctx.name == "kokoro_tts":
        tensors["phonemes"] = string_array(PHONEMES)
    return Request(tensors, request_id=f"r{i}")


def talker_inprocess(ctx):
    """(Orpheus, Qwen3-TTS) pre -> talker.submit (its engine and delivery threads run on) -> the codec on every queued
    talker response (up to max_batch_size at a time, as Triton's dynamic batcher) -> post."""
    steps, max_batch = build_steps(ctx)
    inbox: queue.SimpleQueue = queue.SimpleQueue()

    def go(c):
        first, nbytes, ends, t0 = {}, [0] * c, {}, time.perf_counter()
        for i in range(c):
            x = ok(steps["pre"].execute([speech_request(ctx, i)]))[0]
            sink = Sink(lambda outputs, final=False, i=i: inbox.put((i, outputs, final)))
            steps["talker"].submit(Request({**x, "stream": np.array([True])}, request_id=f"r{i}"), sink)
        while len(ends) < c:
            items = [inbox.get(timeout=600)]
            while len(items) < max_batch and not inbox.empty():
                items.append(inbox.get())
            waves = ok(steps["codec"].execute([Request(ok([o])[0]) for _, o, _ in items]))
            outs = ok(steps["post"].execute([Request(w) for w in waves]))
            now = time.perf_counter()
            for (i, _, final), out in zip(items, outs):
                nbytes[i] += len(out["audio"][0])
                if out["audio"][0]:
                    first.setdefault(i, now)
                if final:
                    ends[i] = now
        return time.perf_counter() - t0, [{"ttfa": first[i] - t0, "latency": ends[i] - t0,
                                           "audio_s": nbytes[i] / 2 / 24000} for i in range(c)]

    return go, steps["talker"].close


def kokoro_inprocess(ctx):
    """pre -> synth (requests in batches of max_batch_size, as Triton queues them) -> chunks -> post."""
    steps, max_batch = build_steps(ctx)

    def go(c):
        per, t0 = [], time.perf_counter()
        for b in range(0, c, max_batch):
            reqs = [speech_request(ctx, i) for i in range(b, min(c, b + max_batch))]
            x = ok(steps["pre"].execute(reqs))
            for w in ok(steps["synth"].execute([Request({**o, **r.tensors}) for o, r in zip(x, reqs)])):
                chunks = []
                steps["chunks"].submit(Request(w), Sink(lambda outputs, final=False: chunks.append(outputs)))
                head = ok(steps["post"].execute([Request(chunks[0])]))
                ttfa = time.perf_counter() - t0
                outs = head + ok(steps["post"].execute([Request(o) for o in chunks[1:]]))
                per.append({"ttfa": ttfa, "latency": time.perf_counter() - t0,
                            "audio_s": sum(len(o["audio"][0]) for o in outs) / 2 / 24000})
        return time.perf_counter() - t0, per

    return go, lambda: None


def orpheus_baseline(ctx):
    from snac import SNAC
    from transformers import LlamaForCausalLM

    from triton_omni.text.tokenizer import load_tokenizer
    from triton_omni.tts.orpheus.talker import chunk_plan
    from triton_omni.tts.orpheus.tokens import OrpheusTokens, frames_to_codes

    tok = load_tokenizer(ctx.folder)
    tokens = OrpheusTokens.from_tokenizer(tok)
    prompt = tokens.prompt(tok, "tara", TEXT)
    model = LlamaForCausalLM.from_pretrained(str(ctx.folder), dtype=ctx.dtype).to(ctx.device).eval()
    snac = SNAC.from_pretrained(str(ctx.codec)).to(ctx.device).eval()
    plan = chunk_plan(ctx.codec, 2, 8)               # orpheus_tts.yaml's first_chunk_frames, chunk_frames
    first_tokens = 7 * (plan.first + plan.right)     # the ensemble's first chunk: 2 frames + lookahead
    static = ctx.device != "cpu"                     # a static cache on the GPU (as bench_ar_decode.py)

    def run(c, n):
        ids = torch.tensor([prompt] * c, device=ctx.device)
        kwargs = dict(max_new_tokens=n, min_new_tokens=n, do_sample=True, temperature=0.6, top_p=0.8, top_k=0,
                      eos_token_id=None, pad_token_id=0, attention_mask=torch.ones_like(ids))
        kwargs.update(dict(cache_implementation="static", disable_compile=not ctx.args.hf_compile) if static else {})
        torch.manual_seed(1000)
        with torch.inference_mode():
            out = model.generate(ids, **kwargs)[:, len(prompt):]
            codes = frames_to_codes(out.cpu().numpy(), tokens.audio_start, 4096)    # the release's layout
            wave = snac.decode([x.to(ctx.device) for x in codes])
        torch.cuda.synchronize() if ctx.device != "cpu" else None
        assert out.shape[1] == n
        return wave

    def go(c):
        t0 = time.perf_counter()
        run(c, first_tokens)
        ttfa, t0 = time.perf_counter() - t0, time.perf_counter()
        wave = run(c, ctx.args.audio_tokens)
        wall = time.perf_counter() - t0
        return wall, [{"ttfa": ttfa, "latency": wall, "audio_s": wave.shape[-1] / 24000}] * c

    return go, lambda: None


def kokoro_baseline(ctx):
    import importlib.util
    import types

    from triton_omni.tts.kokoro.model import WEIGHTS_FILE, load_voice, lstm_cudnn, voice_style

    if "kokoro" not in sys.modules:      # kokoro/model.py alone: the package's __init__ pulls in misaki, spaCy
        package = types.ModuleType("kokoro")
        package.__path__ = list(importlib.util.find_spec("kokoro").submodule_search_locations)
        sys.modules["kokoro"] = package
    from kokoro.model import KModel
    from loguru import logger

    logger.disable("kokoro")
    device = torch.device(ctx.device)
    with lstm_cudnn(device):     # the same LSTM kernels as ours where cuDNN cannot run LSTMs here
        model = KModel(repo_id="hexgrad/Kokoro-82M", config=str(ctx.folder / "config.json"),
                       model=str(ctx.folder / WEIGHTS_FILE)).to(device).eval()
    def in_lstm_context(forward):
        def run(*args, **kwargs):
            with lstm_cudnn(device):
                return forward(*args, **kwargs)
        return run

    for lstm in [m for m in model.modules() if isinstance(m, torch.nn.LSTM)]:
        lstm.forward = in_lstm_context(lstm.forward)
    style = voice_style(load_voice(ctx.folder / "voices" / "af_heart.pt"), len(PHONEMES))[None]

    def go(c):
        per, t0 = [], time.perf_counter()
        for i in range(c):                            # KModel takes one utterance per call
            torch.manual_seed(1000 + i)
            audio = model(PHONEMES, style, 1.0)       # on the host when it returns
            lat = time.perf_counter() - t0
            per.append({"ttfa": lat, "latency": lat, "audio_s": audio.shape[-1] / 24000})
        return time.perf_counter() - t0, per

    return go, lambda: None


def qwen3_tts_baseline(ctx):
    """The package in its own environment (bench_tts_qwen3_package.py), one round per go(c)."""
    import shlex
    import subprocess

    cmd = [*shlex.split(ctx.args.package_python), str(ROOT / "perf_analyzer_configs" / "bench_tts_qwen3_package.py"),
           str(ctx.folder), "--device", ctx.device, "--dtype", str(ctx.dtype).replace("torch.", ""),
           "--frames", str(ctx.args.audio_frames), "--first", "3", "--text", TEXT, "--voice", ctx.voice]
    proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=ROOT)

    def reply() -> dict:
        while True:                          # the package prints notices of its own on stdout: skipped
            line = proc.stdout.readline()
            if not line:
                raise RuntimeError(f"the qwen-tts baseline process ended (rc {proc.wait()}); its stderr is above")
            if line.startswith("@@ "):
                return json.loads(line[3:])
            print(f"  [qwen-tts] {line.rstrip()}", file=sys.stderr)

    ready = reply()
    note = (f"qwen3_tts baseline: qwen-tts {ready.get('qwen_tts')} with transformers {ready['transformers']}, "
            f"torch {ready['torch']}" + (f"; stubbed (never called): {', '.join(ready['stubbed'])}" if ready["stubbed"] else ""))
    if note not in ctx.args.note:
        ctx.args.note.append(note)
    print(note, flush=True)

    def go(c):
        proc.stdin.write(json.dumps({"c": c, "seed": 1000}) + "\n")
        proc.stdin.flush()
        r = reply()
        return r["wall"], [{"ttfa": r["ttfa"], "latency": r["wall"], "audio_s": a} for a in r["audio_s"]]

    def close():
        proc.stdin.close()
        proc.wait(timeout=60)

    return go, close


MODE_FNS = {("orpheus_tts", "baseline"): orpheus_baseline, ("orpheus_tts", "inprocess"): talker_inprocess,
            ("orpheus_tts", "server"): server_mode, ("kokoro_tts", "baseline"): kokoro_baseline,
            ("kokoro_tts", "inprocess"): kokoro_inprocess, ("kokoro_tts", "server"): server_mode,
            ("qwen3_tts", "baseline"): qwen3_tts_baseline, ("qwen3_tts", "inprocess"): talker_inprocess,
            ("qwen3_tts", "server"): server_mode}


# --- results ----------------------------------------------------------------------------------------
def write_results(rows, path: Path, args, gpu=None, versions=None, date=None, notes=()):
    if versions is None:
        versions = {"torch": torch.__version__, "python": platform.python_version()}
        for mod in ("transformers", "snac", "kokoro", "tritonclient", "nvidia-pytriton"):
            try:
                versions[mod] = importlib.metadata.version(mod)
            except importlib.metadata.PackageNotFoundError:
                pass
    gpu = gpu or (torch.cuda.get_device_name(0) if torch.cuda.is_available() else platform.processor() or "cpu")
    for r in rows:
        r.setdefault("command", "python " + " ".join(sys.argv))
    commands = list(dict.fromkeys(r["command"] for r in rows))
    data = {"commands": commands, "date": date or datetime.datetime.now().isoformat(timespec="seconds"), "gpu": gpu,
            "versions": versions, "text": TEXT, "phonemes": PHONEMES, "audio_tokens": args.audio_tokens,
            "audio_frames": args.audio_frames,
            "notes": list(notes), "results": rows}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2, ensure_ascii=False))
    lines = [f"# Speech synthesis benchmark ({gpu})", "", f"{data['date']}; " +
             ", ".join(f"{k} {v}" for k, v in versions.items()) + ". Made by (each row names its command in the JSON):",
             "", *[f"    {c}" for c in commands], "",
             f"Random weights in the released shapes. Text: \"{TEXT}\" (Kokoro: its phonemes). Orpheus: "
             f"{args.audio_tokens} audio tokens per request, Qwen3-TTS {args.audio_frames} frames (EOS ignored). TTFA: request sent -> first PCM chunk "
             "received (baselines: see the script's docstring). RTF: latency / audio seconds. c requests sent "
             "together; p50/p90 over all requests of the repeats.", "",
             "| model | mode | c | requests | audio s | TTFA p50 ms | TTFA p90 ms | RTF p50 | RTF p90 | audio s/s |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    lines += [f"| {r['model']} | {r['mode']} | {r['concurrency']} | {r['requests']} | {r['audio_s']:.2f} | "
              f"{r['ttfa_ms_p50']:.1f} | {r['ttfa_ms_p90']:.1f} | {r['rtf_p50']:.4f} | {r['rtf_p90']:.4f} | "
              f"{r['audio_s_per_s']:.1f} |" for r in rows]
    by = {(r["model"], r["mode"], r["concurrency"]): r for r in rows}
    ratios = [f"- {m} c={c}: {mode} {r['audio_s_per_s'] / by[(m, 'baseline', c)]['audio_s_per_s']:.2f}x the "
              "baseline's audio s/s" for (m, mode, c), r in by.items()
              if mode != "baseline" and (m, "baseline", c) in by]
    lines += ["", "Throughput against the baseline:", "", *ratios] if ratios else []
    lines += ["", "Qwen3-TTS-0.6B targets: TTFA p50 <= 50 ms at c=1, <= 150 ms at c=16; >= 3x the qwen-tts "
              "package's audio s/s at c=16."]
    lines += ["", "Notes:", "", *[f"- {n}" for n in notes]] if notes else []
    path.with_suffix(".md").write_text("\n".join(lines) + "\n")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", nargs="+", default=["orpheus_tts", "kokoro_tts"],
                    choices=["orpheus_tts", "kokoro_tts", "qwen3_tts"])
    ap.add_argument("--audio-frames", type=int, default=100, help="Qwen3-TTS frames per request (12.5 a second)")
    ap.add_argument("--package-python", default=str(ROOT / ".venv-qwentts" / "bin" / "python"),
                    help="the command that runs python in the qwen-tts environment (the qwen3_tts baseline)")
    ap.add_argument("--modes", nargs="+", default=list(MODES), choices=MODES)
    ap.add_argument("--concurrency", nargs="+", type=int, default=[1, 8, 32])
    ap.add_argument("--repeats", type=int, default=3, help="rounds of c requests per row")
    ap.add_argument("--audio-tokens", type=int, default=7 * 88, help="Orpheus tokens per request (7 per frame)")
    ap.add_argument("--shapes", default="real", choices=list(SHAPES), help="tiny: seconds on a CPU")
    ap.add_argument("--hf-compile", action="store_true", help="let transformers compile its static-cache decode")
    ap.add_argument("--workdir", default="/tmp/triton-omni-bench-tts")
    ap.add_argument("--out", type=Path, default=ROOT / "perf_analyzer_configs" / "results" / "tts.json")
    ap.add_argument("--smoke", action="store_true", help="tiny shapes, c 1 2, one round, 84 tokens: checks the script")
    ap.add_argument("--merge", nargs="+", type=Path, help="combine the results of separate runs into --out")
    ap.add_argument("--note", action="append", default=[], help="a note for the results")
    ap.add_argument("--set", action="append", default=[], help="a converter override for the server mode (KEY=VALUE)")
    ap.add_argument("--server-arg", action="append", default=[],
                    help="an extra tritonserver argument for the server mode, e.g. --server-arg=--trace-config=rate=1")
    ap.add_argument("--server-stats", action="store_true", help="print each served step's Triton statistics at the end")
    args = ap.parse_args()
    if args.merge:
        parts, rows, notes = merge_parts(args.merge, ("model", "mode", "concurrency"), args.note)
        args.audio_tokens = parts[0]["audio_tokens"]
        args.audio_frames = next((p["audio_frames"] for p in parts if "audio_frames" in p), args.audio_frames)
        write_results(rows, args.out, args, parts[0]["gpu"], parts[0]["versions"],
                      max(p["date"] for p in parts), notes)
        print(args.out.with_suffix(".md").read_text())
        return 0
    if args.smoke:
        args.shapes, args.concurrency, args.repeats, args.audio_tokens, args.audio_frames = "tiny", [1, 2], 1, 7 * 12, 12
    cuda = torch.cuda.is_available()
    if not cuda:
        torch.set_num_threads(1)   # a CPU check shares its cores (as bench_image.py)
    device, dtype = ("cuda:0", torch.bfloat16) if cuda else ("cpu", torch.float32)
    root, rows = Path(args.workdir) / "checkpoints", []
    for name in args.models:
        ctx = argparse.Namespace(name=name, args=args, device=device, dtype=dtype, target="gpu" if cuda else "cpu",
                                 voice={"kokoro_tts": "af_heart", "qwen3_tts": "vivian"}.get(name, "tara"),
                                 overrides=[])
        if name == "qwen3_tts":
            ctx.folder = write_qwen3_tts(root, args.shapes, device, dtype)
            if max(args.concurrency) > (64 if cuda else 8):          # the ensemble's talker max_num_seqs
                ctx.overrides.append(f"{name}.talker.max_num_seqs={max(args.concurrency)}")
        elif name == "orpheus_tts":
            ctx.folder, ctx.codec = write_orpheus(root, args.shapes, device, dtype)
            ctx.overrides = [f"{name}.codec_checkpoint={ctx.codec}"]
            if max(args.concurrency) > (64 if cuda else 8):          # the ensemble's talker max_num_seqs
                ctx.overrides.append(f"{name}.talker.max_num_seqs={max(args.concurrency)}")
        else:
            ctx.folder = write_kokoro(root, args.shapes)
        ctx.overrides += args.set
        for mode in [m for m in MODES if m in args.modes]:
            t = time.perf_counter()
            go, close = MODE_FNS[(name, mode)](ctx)
            print(f"{name} {mode}: ready in {time.perf_counter() - t:.0f} s", flush=True)
            try:
                go(1)                                       # warm-up: one request, then the largest round
                go(max(args.concurrency))
                for c in args.concurrency:
                    rows.append(summarize(name, mode, c, [go(c) for _ in range(args.repeats)]))
                    print(json.dumps(rows[-1]), flush=True)
                    write_results(rows, args.out, args, notes=args.note)    # after every row: a timeout keeps it
            finally:
                close()
                del go, close
                gc.collect()
                torch.cuda.empty_cache() if cuda else None
    write_results(rows, args.out, args, notes=args.note)
    print(args.out.with_suffix(".md").read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
