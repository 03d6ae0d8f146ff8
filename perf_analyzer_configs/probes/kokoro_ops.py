"""Kokoro on the CPU, counted as a GPU would see it: kernels (aten ops that are not views) and host
syncs per utterance, ours (`Kokoro.synthesize`, and the synth step around it) vs the `kokoro`
package's `KModel` forward, on the released shapes with random weights (the speech benchmark's checkpoint and
phonemes, written to a temporary folder). The model is small, so on a GPU it is launch-bound: these
counts, not FLOPs, decide its speed.

    python -m perf_analyzer_configs.probes.kokoro_ops     # counts, top ops, where syncs happen, CPU time
    python -m perf_analyzer_configs.probes.kokoro_ops --shapes tiny

How kernels, host ops and host syncs are told apart: perf_analyzer_configs/probes/op_count.py.
Code that branches on where a tensor is hides its GPU-only syncs here: the package's LSTMs call
`lengths.to("cpu")` (a read) and its packing copies the sort back to the device, four times each on a
GPU, which this count cannot see on the CPU. An LSTM counts as one op here (the CPU fuses it); on a
GPU without cuDNN it is ~3 kernels per step and direction (~6400 for the utterance), in both alike.
CPU wall time is printed as a secondary signal (noisy on a shared machine).
"""
from __future__ import annotations

import argparse
import importlib.util
import sys
import tempfile
import types
from pathlib import Path

import torch

from perf_analyzer_configs.probes.op_count import count


def kmodel(folder: Path):
    """The release's KModel without the package's __init__ (misaki, spaCy), as the tests import it."""
    if "kokoro" not in sys.modules:
        package = types.ModuleType("kokoro")
        package.__path__ = list(importlib.util.find_spec("kokoro").submodule_search_locations)
        sys.modules["kokoro"] = package
    from kokoro.model import KModel
    from loguru import logger

    logger.disable("kokoro")
    return KModel(repo_id="hexgrad/Kokoro-82M", config=str(folder / "config.json"),
                  model=str(folder / "kokoro-v1_0.pth")).eval()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", default="real", choices=["real", "tiny"])
    ap.add_argument("--top", type=int, default=12)
    ap.add_argument("--no-package", action="store_true", help="ours only")
    args = ap.parse_args()

    import numpy as np

    from perf_analyzer_configs.benchmarks.tts_checkpoints import PHONEMES, write_kokoro
    from triton_omni.runtime.step import Request, StepContext
    from triton_omni.tts.kokoro.model import load_voice, voice_style
    from triton_omni.tts.kokoro.steps import KokoroSynth, KokoroSynthParams
    from triton_omni.tts.request import Speech

    torch.set_grad_enabled(False)
    with tempfile.TemporaryDirectory() as tmp:
        folder = write_kokoro(Path(tmp), args.shapes)
        params = KokoroSynthParams(checkpoint=str(folder))
        synth = KokoroSynth(StepContext("kokoro_synth", params, "cpu", folder.parent))
        ours = synth.model
        ids = [0, *(ours.vocab[c] for c in PHONEMES), 0]
        style = voice_style(load_voice(folder / "voices" / "af_heart.pt"), len(PHONEMES))[None]
        print(f"{len(PHONEMES)} phonemes, {sum(p.numel() for p in ours.parameters()) / 1e6:.1f}M parameters, "
              f"{torch.get_num_threads()} CPU threads")

        def synthesize():
            (wave, frames), = ours.synthesize([ids], style, torch.ones(1), [torch.Generator().manual_seed(1)])
            return wave

        seconds = len(synthesize()) / 24000
        print(f"{seconds:.1f} s of audio")
        count(ours, synthesize, "ours: Kokoro.synthesize", args.top)
        request = Request({"phoneme_ids": np.asarray(ids, np.int32), "segments": np.asarray([len(ids)], np.int32),
                           "style": style.numpy(), "speech": Speech(1, "pcm", True).tensor()})
        count(ours, lambda: synth.execute([request]), "ours: the kokoro_synth step", args.top)
        if not args.no_package:
            reference = kmodel(folder)

            def package():
                torch.manual_seed(1)
                return reference(PHONEMES, style, 1.0)

            count(reference, package, "package: KModel(phonemes, style, 1.0)", args.top)


if __name__ == "__main__":
    main()
