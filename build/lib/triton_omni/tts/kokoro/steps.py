"""Kokoro's steps: pre (text or phonemes -> segments of phoneme ids, a style each), synth (a
request's segments together -> its waveform), speech_chunks (tts/chunking.py: the waveform as a
stream of pieces), then speech_post (python_backends/tts/post.py) for PCM chunks or a file.

Kokoro is not autoregressive: a request's audio exists whole once synth has run (much faster than
real time), so streaming is cutting it into chunks, the first one small so a player starts at
once. Streamed and non-streamed requests run the same synthesis: the chunks concatenate to the
non-streamed audio. The only randomness is the vocoder source's noise, seeded per request
(`sampling_parameters.seed`, else drawn in pre): a seeded request gets the same samples whatever
else is in the server.
"""
from __future__ import annotations

import json
from dataclasses import dataclass

import numpy as np
import torch

from triton_omni.runtime.errors import InvalidInput
from triton_omni.runtime.params import torch_dtype
from triton_omni.runtime.spec import TensorSpec
from triton_omni.runtime.step import Request, Step, StepContext, register, string_array
from triton_omni.tts.checks import finite, float_scalar, ids_in_range
from triton_omni.tts.kokoro.model import MAX_PHONEMES, SAMPLE_RATE, Kokoro, load_voice, voice_style
from triton_omni.tts.kokoro.text import Phonemizer, check_phonemes, segments
from triton_omni.tts.request import (SPEECH, SPEECH_INPUTS, SPEED_RANGE, Speech, as_numpy, parse_speech, reject_reference,
                                     request_seed)

PHONEMES = TensorSpec("phonemes", "TYPE_STRING", (1,), optional=True)


@dataclass
class KokoroPreParams:
    checkpoint: str = ""
    default_voice: str = "af_heart"
    max_text_chars: int = 4096          # OpenAI's limit on `input`; longer phonemes are spoken in segments
    espeak: str = "espeak-ng"           # the phonemizer program for text (see text.py)


@register("kokoro_pre")
class KokoroPre(Step):
    inputs = SPEECH_INPUTS + (PHONEMES,)
    outputs = (
        TensorSpec("phoneme_ids", "TYPE_INT32", (-1,)),     # every segment's ids, each within boundary 0s
        TensorSpec("segments", "TYPE_INT32", (-1,)),        # the length of each segment's ids
        TensorSpec("style", "TYPE_FP32", (-1, 256)),        # a voice style per segment
        SPEECH,
    )
    Params = KokoroPreParams

    def __init__(self, ctx: StepContext):
        super().__init__(ctx)
        folder = ctx.checkpoint(self.params.checkpoint)
        self.vocab = json.loads((folder / "config.json").read_text(encoding="utf-8"))["vocab"]
        self.packs = {p.stem: load_voice(p) for p in sorted((folder / "voices").glob("*.pt"))}
        self.voices = list(self.packs)
        if self.params.default_voice not in self.packs:
            voice = self.params.default_voice
            raise ValueError(f"default_voice {voice!r} has no voices/{voice}.pt in {folder}; "
                             f"voices there: {self.voices}")
        self.phonemizer = Phonemizer(self.vocab, self.params.espeak)

    def parse(self, req: Request, phonemes: str):
        """The speech route's inputs; with `phonemes` they stand in for the text (and errors say so)."""
        if not phonemes:
            return parse_speech(req, self.voices, self.params.default_voice, self.params.max_text_chars, SPEED_RANGE)
        view = Request({**req.tensors, "text": string_array(phonemes)})
        try:
            return parse_speech(view, self.voices, self.params.default_voice, self.params.max_text_chars, SPEED_RANGE)
        except InvalidInput as e:
            if e.field != "text":
                raise
            raise InvalidInput("phonemes", str(e).split(": ", 1)[1]) from None

    def seed(self, req: Request) -> int:
        raw = req.json("sampling_parameters") or {}
        if not isinstance(raw, dict):
            raise InvalidInput("sampling_parameters", "expected a JSON object")
        for key in raw:
            if key != "seed":
                raise InvalidInput(f"sampling_parameters.{key}", "does not apply to Kokoro (it does not sample); "
                                                                  "only seed is read")
        return request_seed(raw)

    def one(self, req: Request) -> dict:
        phonemes = (req.string("phonemes") or "").strip()
        speech = self.parse(req, phonemes)
        reject_reference(req, self.voices)
        seed = self.seed(req)
        phonemes = check_phonemes(phonemes, self.vocab) if phonemes else self.phonemizer(speech.text, speech.voice)
        if not phonemes:
            raise InvalidInput("text", "has nothing to speak (no phonemes)")
        pieces = segments(phonemes)
        ids = [[0, *(self.vocab[c] for c in p), 0] for p in pieces]
        # the release picks a style by the phoneme string's length (symbols, spaces included)
        style = torch.stack([voice_style(self.packs[speech.voice], len(p)) for p in pieces])
        return {"phoneme_ids": np.asarray([i for row in ids for i in row], dtype=np.int32),
                "segments": np.asarray([len(row) for row in ids], dtype=np.int32),
                "style": style.numpy().astype(np.float32),
                "speech": Speech(seed, speech.response_format, speech.stream).tensor()}


@dataclass
class KokoroSynthParams:
    checkpoint: str = ""
    dtype: str = "float32"
    # phoneme ids of one request at most, boundaries included: pre's 4096 characters make ~4.5k
    max_phonemes: int = 16384


@register("kokoro_synth")
class KokoroSynth(Step):
    inputs = (
        TensorSpec("phoneme_ids", "TYPE_INT32", (-1,), ragged=True),
        TensorSpec("segments", "TYPE_INT32", (-1,), ragged=True),
        TensorSpec("style", "TYPE_FP32", (-1, 256), ragged=True),
        TensorSpec("speed", "TYPE_FP32", (1,), optional=True),     # the request's own, checked by pre
        SPEECH,
    )
    outputs = (
        TensorSpec("waveform", "TYPE_FP32", (-1,)),
        TensorSpec("sample_rate", "TYPE_INT32", (1,)),
        SPEECH,
    )
    Params = KokoroSynthParams

    def __init__(self, ctx: StepContext):
        super().__init__(ctx)
        self.model = Kokoro.load(ctx.checkpoint(self.params.checkpoint), ctx.device, torch_dtype(self.params.dtype))

    def input_limits(self) -> dict:
        most = self.params.max_phonemes
        return {"phoneme_ids": (most,), "segments": (most // 3,), "style": (most // 3, None)}   # 3+ ids a segment

    def check(self, ids: np.ndarray, lengths: np.ndarray, style: np.ndarray) -> None:
        """The segments pre made: each one's ids within boundary 0s and PL-BERT's positions, a style each."""
        if not lengths.size:
            raise InvalidInput("segments", "is empty")
        if int(lengths.min()) < 3 or int(lengths.max()) > MAX_PHONEMES + 2:
            raise InvalidInput("segments", f"each segment has 3 to {MAX_PHONEMES + 2} ids (its phonemes and 2 "
                                           f"boundary 0s); got lengths from {int(lengths.min())} to {int(lengths.max())}")
        if int(lengths.sum()) != ids.size:
            raise InvalidInput("segments", f"the lengths add up to {int(lengths.sum())}, phoneme_ids has {ids.size}")
        if style.shape[0] != lengths.size:
            raise InvalidInput("style", f"{style.shape[0]} styles for {lengths.size} segments")
        ids_in_range("phoneme_ids", ids, self.model.config["n_token"])
        finite("style", style)

    def one(self, req: Request) -> dict:
        """A request's segments through the model together (see `Kokoro.synthesize`), its noise from
        its own generator. Requests are not padded into one forward: a row batched with others rounds
        differently, and the vocoder turns that into different samples (model.py), so a seeded
        request would sound different depending on its neighbours. Triton still queues them together."""
        ids, lengths, style = (as_numpy(req.get(name)) for name in ("phoneme_ids", "segments", "style"))
        self.check(ids, lengths, style)
        lengths, style = lengths.tolist(), torch.as_tensor(style)
        # on the model's device: the source's noise is drawn there (see model.SineSource)
        gen = torch.Generator(self.model.device).manual_seed(Speech.from_request(req).seed)
        speed = float_scalar(req, "speed", *SPEED_RANGE, default=1.0)
        bounds = np.cumsum([0, *lengths])
        rows = [ids[a:b].tolist() for a, b in zip(bounds[:-1], bounds[1:])]
        waves = self.model.synthesize(rows, style, torch.tensor([speed] * len(rows)), [gen] * len(rows))
        return {"waveform": np.concatenate([w.float().cpu().numpy() for w, _ in waves]).astype(np.float32),
                "sample_rate": np.asarray([SAMPLE_RATE], dtype=np.int32), "speech": req.get("speech")}
