"""OmniVoice's steps (ensemble_configs/omnivoice_tts.yaml): pre -> generate -> codec -> speech_chunks ->
speech_post (python_backends/tts/omnivoice/model.py has the model and how it generates).

`omnivoice_pre`       speech inputs -> prompt token ids, the number of frames to generate (the release's
                      duration estimate, divided by `speed`), the sampling temperature and `speech`
                      (seed drawn here when absent). `voice` is `auto` (the model picks a voice) or a
                      voice design: attributes such as "female, low pitch, british accent" (the release's
                      `instruct`). Voice cloning: `reference_audio` (any file PyAV reads) with its
                      transcript `reference_text` (required: the release would transcribe a clip
                      without one with Whisper, which is not served) -> the clip's codes, encoded here
                      on the CPU once per request, and its RMS (the new speech's loudness). Bad
                      requests fail here, naming the field.
`omnivoice_generate`  every request of the batch in one masked-decoding loop (N steps, each one forward of
                      all requests' conditional and unconditional rows); a request's random draws come
                      from its own seeded generator and its attention stays within its own rows, so its
                      codes are the same alone or batched.
`omnivoice_codec`     codes -> 24 kHz waveform (the HiggsAudioV2 tokenizer's decoder), the release's
                      post-processing (silence removal, loudness, fade, padding). Requests of a batch
                      are decoded one by one: the decoder's convolutions round differently in a batch
                      (~1e-4 of full scale) and padding changes a shorter request's last ~0.4 s, so
                      batching would move a request's samples.

Not autoregressive: the audio exists whole after the codec, so streaming is `speech_chunks` cutting it
(streamed chunks concatenate to the non-streamed audio).
Not served: a reference clip without its transcript (the release's ASR), a language choice (the release's language-agnostic mode
is used), texts longer than one pass (the release generates those in chunks).
"""
from __future__ import annotations

import json
import random
from dataclasses import dataclass

import numpy as np
import torch

from triton_omni.runtime.errors import InvalidInput
from triton_omni.runtime.params import torch_dtype
from triton_omni.runtime.spec import TensorSpec
from triton_omni.runtime.step import Request, Step, StepContext, register
from triton_omni.text.tokenizer import load_tokenizer
from triton_omni.tts.omnivoice.codec import Codec, CodecEncoder, codec_sizes, finish, prepare_reference
from triton_omni.tts.omnivoice.model import (Job, OmniVoiceModel, Settings, estimate_frames, generate, prompt_ids,
                                             punctuate, voice_design)
from triton_omni.tts.request import (SPEECH, SPEECH_INPUTS, SPEED_RANGE, Speech, as_numpy, has_reference,
                                     parse_speech, read_reference)

AUTO = "auto"


@dataclass
class OmniVoicePreParams:
    checkpoint: str = ""
    default_voice: str = AUTO
    max_text_chars: int = 4096
    max_seconds: float = 30.0          # the release generates longer texts in chunks, which is not served
    min_reference_seconds: float = 1.0
    max_reference_seconds: float = 20.0   # the release warns above 20 s (slower, worse clones)


@register("omnivoice_pre")
class OmniVoicePre(Step):
    inputs = SPEECH_INPUTS
    outputs = (
        TensorSpec("prompt_ids", "TYPE_INT32", (-1,)),
        TensorSpec("frames", "TYPE_INT32", (1,)),
        TensorSpec("temperature", "TYPE_FP32", (1,)),
        SPEECH,
        TensorSpec("reference_codes", "TYPE_INT32", (-1,)),  # [codebooks * frames], codebook-major; [] for none
        TensorSpec("reference_rms", "TYPE_FP32", (1,)),      # the clip's RMS; -1 without a reference
    )
    Params = OmniVoicePreParams

    def __init__(self, ctx: StepContext):
        super().__init__(ctx)
        folder = ctx.checkpoint(self.params.checkpoint)
        self.tokenizer = load_tokenizer(folder)
        self.frame_rate = codec_sizes(json.loads((folder / "audio_tokenizer" / "config.json").read_text())).frame_rate
        self.encoder = CodecEncoder.load(folder / "audio_tokenizer")     # float32 on the CPU, once per clone
        self.max_frames = int(self.params.max_seconds * self.frame_rate)
        if self.params.default_voice.lower() != AUTO:
            voice_design(self.params.default_voice, "")        # a bad default fails at load time

    def sampling(self, req: Request) -> tuple[int, float]:
        raw = req.json("sampling_parameters") or {}
        if not isinstance(raw, dict):
            raise InvalidInput("sampling_parameters", "expected a JSON object")
        for key in raw:
            if key not in ("seed", "temperature"):
                raise InvalidInput(f"sampling_parameters.{key}", "does not apply to OmniVoice; seed and temperature "
                                                                  "are read")
        seed, temperature = raw.get("seed"), raw.get("temperature", 0.0)
        if seed is None:
            seed = random.randrange(2 ** 31)
        if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
            raise InvalidInput("sampling_parameters.seed", f"expected an integer >= 0, got {seed!r}")
        if isinstance(temperature, bool) or not isinstance(temperature, (int, float)) or not 0 <= temperature <= 10:
            raise InvalidInput("sampling_parameters.temperature", f"expected a number in [0, 10], got {temperature!r}")
        return seed, float(temperature)

    def reference(self, req: Request) -> tuple[np.ndarray, str, float] | None:
        """The request's voice to clone: (codes [codebooks, frames], punctuated transcript, the clip's
        RMS), or None without one. The clip is decoded at its own rate and resampled as the release
        resamples it (torchaudio's sinc kernel, rebuilt in `resample`)."""
        if not has_reference(req):
            return None
        p, rate = self.params, self.encoder.sample_rate
        wave, transcript = read_reference(req, rate, p.min_reference_seconds, p.max_reference_seconds,
                                          p.max_text_chars, "automatic transcription is not served")
        wave, rms = prepare_reference(wave.numpy(), rate, self.encoder.sizes.hop)
        if wave.size == 0:
            raise InvalidInput("reference_audio", "is silent: nothing is left after removing silence")
        codes = self.encoder.encode(torch.from_numpy(wave)).numpy()
        return codes, punctuate(transcript), rms

    def one(self, req: Request) -> dict:
        p = self.params
        voice = (req.string("voice") or "").strip() or p.default_voice
        speech = parse_speech(req, [voice], voice, p.max_text_chars, SPEED_RANGE)
        instruct = None
        if voice.lower() != AUTO:
            try:
                instruct = voice_design(voice, speech.text)
            except ValueError as exc:
                raise InvalidInput("voice", str(exc)) from None
        seed, temperature = self.sampling(req)
        ref = self.reference(req)
        codes, ref_text, rms = ref if ref else (np.zeros((0, 0), np.int64), None, -1.0)
        frames = estimate_frames(speech.text, ref_text, codes.shape[-1], speech.speed)
        if frames > self.max_frames:
            raise InvalidInput("text", f"is too long for one utterance: about {frames / self.frame_rate:.0f} s of "
                                       f"speech; at most {p.max_seconds:g} s")
        ids = prompt_ids(self.tokenizer, speech.text, instruct, ref_text, denoise=ref is not None)
        return {"prompt_ids": np.asarray(ids, dtype=np.int32), "frames": np.asarray([frames], dtype=np.int32),
                "temperature": np.asarray([temperature], dtype=np.float32),
                "speech": Speech(seed, speech.response_format, speech.stream).tensor(),
                "reference_codes": codes.reshape(-1).astype(np.int32),
                "reference_rms": np.asarray([rms], dtype=np.float32)}


@dataclass
class OmniVoiceGenerateParams:
    checkpoint: str = ""
    dtype: str = "float32"
    num_step: int = 32                 # the release's decoding defaults (OmniVoiceGenerationConfig)
    guidance_scale: float = 2.0
    t_shift: float = 0.1
    layer_penalty_factor: float = 5.0
    position_temperature: float = 5.0


@register("omnivoice_generate")
class OmniVoiceGenerate(Step):
    inputs = (
        TensorSpec("prompt_ids", "TYPE_INT32", (-1,), ragged=True),
        TensorSpec("frames", "TYPE_INT32", (1,)),
        TensorSpec("temperature", "TYPE_FP32", (1,)),
        SPEECH,
        TensorSpec("reference_codes", "TYPE_INT32", (-1,), ragged=True),
    )
    outputs = (
        TensorSpec("codes", "TYPE_INT32", (-1,)),            # [codebooks * frames], codebook-major
        SPEECH,
    )
    Params = OmniVoiceGenerateParams

    def __init__(self, ctx: StepContext):
        super().__init__(ctx)
        p = self.params
        self.model = OmniVoiceModel.load(ctx.checkpoint(p.checkpoint), ctx.device, torch_dtype(p.dtype))
        self.settings = Settings(p.num_step, p.guidance_scale, p.t_shift, p.layer_penalty_factor,
                                 p.position_temperature)

    def job(self, req: Request) -> Job:
        ids = torch.from_numpy(as_numpy(req.get("prompt_ids")).astype(np.int64))
        frames = int(req.scalar("frames"))
        if ids.numel() == 0 or frames < 1:
            raise ValueError(f"inconsistent request: {ids.numel()} prompt ids, {frames} frames")
        ref = torch.from_numpy(as_numpy(req.get("reference_codes")).astype(np.int64))
        if ref.numel() % self.model.codebooks:
            raise ValueError(f"{ref.numel()} reference codes are not whole frames of {self.model.codebooks}")
        # text ids repeated over the codebook rows, then the reference's frames (audio positions)
        prompt = torch.cat([ids.repeat(self.model.codebooks, 1), ref.view(self.model.codebooks, -1)], dim=1)
        return Job(prompt, ids.numel(), frames, Speech.from_request(req).seed, float(req.scalar("temperature")))

    def execute(self, requests: list[Request]) -> list[dict | BaseException]:
        def run(reqs, jobs):
            for req, codes in zip(reqs, generate(self.model, jobs, self.settings)):
                yield {"codes": codes.reshape(-1).numpy().astype(np.int32), "speech": req.get("speech")}
        return self.execute_jobs(requests, run)


@dataclass
class OmniVoiceCodecParams:
    checkpoint: str = ""
    remove_silence: bool = True        # the release's postprocess_output: silences over 0.5 s shortened


@register("omnivoice_codec")
class OmniVoiceCodec(Step):
    inputs = (TensorSpec("codes", "TYPE_INT32", (-1,), ragged=True), SPEECH,
              TensorSpec("reference_rms", "TYPE_FP32", (1,)))
    outputs = (
        TensorSpec("waveform", "TYPE_FP32", (-1,)),
        TensorSpec("sample_rate", "TYPE_INT32", (1,)),
        SPEECH,
    )
    Params = OmniVoiceCodecParams

    def __init__(self, ctx: StepContext):
        super().__init__(ctx)
        folder = ctx.checkpoint(self.params.checkpoint)
        self.codebooks = json.loads((folder / "config.json").read_text())["num_audio_codebook"]
        self.codec = Codec.load(folder / "audio_tokenizer", ctx.device)     # float32: a small decoder

    def one(self, req: Request) -> dict:
        codes = torch.from_numpy(as_numpy(req.get("codes")).astype(np.int64))
        if codes.numel() == 0 or codes.numel() % self.codebooks:
            raise ValueError(f"{codes.numel()} codes are not whole frames of {self.codebooks}")
        wave = self.codec.decode(codes.view(1, self.codebooks, -1).to(self.codec.fc2.weight.device))[0]
        rate = self.codec.sample_rate
        rms = float(req.scalar("reference_rms"))          # a clone takes its reference's loudness
        wave = finish(wave.float().cpu().numpy(), rate, rms if rms >= 0 else None, self.params.remove_silence)
        return {"waveform": wave, "sample_rate": np.asarray([rate], np.int32),
                "speech": req.get("speech")}
