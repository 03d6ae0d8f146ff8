"""The `qwen-tts` package's own inference, timed for perf_analyzer_configs/bench_tts.py (its qwen3_tts baseline).

Runs in the package's environment (qwen-tts 0.1.1 pins transformers 4.57.3, ours has 5.x), as a child
process that bench_tts.py drives over stdin/stdout: one JSON line per round.

    PY bench_tts_qwen3_package.py FOLDER --device cuda:0 --frames 100 --first 3 --text "..." --voice vivian
    stdin:  {"c": 8, "seed": 1000}          stdout: @@ {"wall": s, "ttfa": s, "audio_s": [..]}
    (replies start with "@@ ": the package prints notices of its own on stdout)

A round is c texts in one `generate_custom_voice` call (the package batches a list of texts; it does
not stream), with the release's sampling (do_sample, temperature 0.9, top-k 50, repetition penalty
1.05; the code predictor likewise), text given as the streaming prompt (non_streaming_mode=False, as
our ensemble builds it). Exactly --frames frames per text: the talker's `min_new_tokens` (the package
fixes it at 2) is raised to the frame count, so EOS is never sampled and every mode makes the same audio
length. TTFA: the package cannot stream, so (as for Orpheus' baseline) it is the time to generate the
frames of our ensemble's first chunk (--first) and decode them: the earliest the package could hand out
audio. wall: the whole call (generate + the speech tokenizer's decode).

Modules the package imports but this path never calls (librosa, soundfile, sox, onnxruntime,
torchaudio: reference-audio loading and the 25 Hz tokenizer) are stubbed when missing, so the
package runs where only torch, transformers 4.57.3, accelerate and huggingface_hub are installed.
"""
from __future__ import annotations

import argparse
import importlib.abc
import importlib.machinery
import importlib.util
import json
import sys
import time
import types

OPTIONAL = ("librosa", "soundfile", "sox", "onnxruntime", "torchaudio")


class _Stub(types.ModuleType):
    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)

        def unavailable(*args, **kwargs):
            raise RuntimeError(f"{self.__name__}.{name} is not installed here (stubbed for the benchmark)")
        return unavailable


class _StubFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def __init__(self, roots):
        self.roots = set(roots)

    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in self.roots:
            return importlib.machinery.ModuleSpec(name, self, is_package=True)
        return None

    def create_module(self, spec):
        module = _Stub(spec.name)
        module.__path__ = []
        return module

    def exec_module(self, module):
        pass


def stub_missing() -> list[str]:
    missing = [m for m in OPTIONAL if importlib.util.find_spec(m) is None]
    if missing:
        sys.meta_path.insert(0, _StubFinder(missing))
    return missing


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("folder")
    ap.add_argument("--device", default="cuda:0")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--frames", type=int, required=True)
    ap.add_argument("--first", type=int, default=3)
    ap.add_argument("--text", required=True)
    ap.add_argument("--voice", default="vivian")
    args = ap.parse_args()
    stubbed = stub_missing()

    import importlib.metadata

    import torch
    import transformers
    from qwen_tts import Qwen3TTSModel

    dtype = getattr(torch, args.dtype)
    tts = Qwen3TTSModel.from_pretrained(args.folder, dtype=dtype, device_map=args.device, attn_implementation="sdpa")
    talker = tts.model.talker
    generate = talker.generate
    wanted = {"frames": 2}

    def fixed_length(**kwargs):          # the package passes min_new_tokens=2; raise it to the frame count
        return generate(**{**kwargs, "min_new_tokens": wanted["frames"]})

    talker.generate = fixed_length
    cuda = torch.device(args.device).type == "cuda"

    def sync():
        if cuda:
            torch.cuda.synchronize()

    def speak(c: int, frames: int):
        # the package keeps the frames of all but the last generated code 0 (that step's predictor
        # codes come with the next forward, which generate never runs): one more step makes `frames`
        wanted["frames"] = frames + 1
        wavs, rate = tts.generate_custom_voice([args.text] * c, speaker=args.voice, language="auto",
                                               non_streaming_mode=False, max_new_tokens=frames + 1)
        assert all(len(w) == frames * 1920 for w in wavs), [len(w) for w in wavs]
        return wavs, rate

    print("@@ " + json.dumps({"ready": True, "stubbed": stubbed, "transformers": transformers.__version__,
                             "qwen_tts": importlib.metadata.version("qwen-tts"),
                      "torch": torch.__version__}), flush=True)
    for line in sys.stdin:
        job = json.loads(line)
        torch.manual_seed(job.get("seed", 0))
        sync()
        t0 = time.perf_counter()
        speak(job["c"], args.first)
        sync()
        ttfa, t0 = time.perf_counter() - t0, time.perf_counter()
        wavs, rate = speak(job["c"], args.frames)
        sync()
        wall = time.perf_counter() - t0
        print("@@ " + json.dumps({"wall": wall, "ttfa": ttfa, "audio_s": [len(w) / rate for w in wavs]}), flush=True)


if __name__ == "__main__":
    main()
