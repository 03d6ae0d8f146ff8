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
import math
from dataclasses import dataclass

import numpy as np
import torch

from triton_omni.runtime.errors import InvalidInput
from triton_omni.runtime.params import torch_dtype
from triton_omni.runtime.spec import TensorSpec
from triton_omni.runtime.step import Request, Step, StepContext, register
from triton_omni.text.tokenizer import load_tokenizer
from triton_omni.tts.checks import float_scalar, ids_in_range, int_scalar, whole
from triton_omni.tts.omnivoice.codec import Codec, CodecEncoder, codec_sizes, finish, prepare_reference
from triton_omni.tts.omnivoice.model import (Job, OmniVoiceModel, Settings, estimate_frames, generate, prompt_ids,
                                             punctuate, voice_design)
from triton_omni.tts.request import (SPEECH, SPEECH_INPUTS, SPEED_RANGE, Speech, as_numpy, has_reference,
                                     parse_speech, read_reference, request_seed)

AUTO = "auto"


def codec_frame_rate(folder) -> int:
    """Frames a second of the checkpoint's audio tokenizer (its config alone)."""
    return codec_sizes(json.loads((folder / "audio_tokenizer" / "config.json").read_text())).frame_rate


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
        self.frame_rate = codec_frame_rate(folder)
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
        seed, temperature = request_seed(raw), raw.get("temperature", 0.0)
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
    max_seconds: float = 30.0          # the longest speech generated (pre's max_seconds)
    max_reference_seconds: float = 20.0   # the longest reference clip (pre's)
    # prompt ids at most: a voice design's, the text's and a clone's transcript's (pre's max_text_chars each)
    max_prompt_tokens: int = 16384
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
        rate = codec_frame_rate(ctx.checkpoint(p.checkpoint))
        self.max_frames = int(p.max_seconds * rate)
        self.max_reference_frames = math.ceil(p.max_reference_seconds * rate) + 1   # the encoder rounds up

    def input_limits(self) -> dict:
        # the attention mask of a request is [length, length]: every bound keeps it small
        return {"prompt_ids": (self.params.max_prompt_tokens,),
                "reference_codes": (self.max_reference_frames * self.model.codebooks,)}

    def job(self, req: Request) -> Job:
        ids, ref = as_numpy(req.get("prompt_ids")), as_numpy(req.get("reference_codes"))
        if not ids.size:
            raise InvalidInput("prompt_ids", "is empty")
        ids_in_range("prompt_ids", ids, self.model.llm.embed_tokens.num_embeddings)
        frames = int_scalar(req, "frames", 1, self.max_frames)
        whole("reference_codes", ref.size, self.model.codebooks)
        ids_in_range("reference_codes", ref, self.model.vocab)
        temperature = float_scalar(req, "temperature", 0.0, 10.0)
        ids, ref = torch.from_numpy(ids.astype(np.int64)), torch.from_numpy(ref.astype(np.int64))
        # text ids repeated over the codebook rows, then the reference's frames (audio positions)
        prompt = torch.cat([ids.repeat(self.model.codebooks, 1), ref.view(self.model.codebooks, -1)], dim=1)
        return Job(prompt, ids.numel(), frames, Speech.from_request(req).seed, temperature)

    def execute(self, requests: list[Request]) -> list[dict | BaseException]:
        def run(reqs, jobs):
            for req, codes in zip(reqs, generate(self.model, jobs, self.settings)):
                yield {"codes": codes.reshape(-1).numpy().astype(np.int32), "speech": req.get("speech")}
        return self.execute_jobs(requests, run)


@dataclass
class OmniVoiceCodecParams:
    checkpoint: str = ""
    remove_silence: bool = True        # the release's postprocess_output: silences over 0.5 s shortened
    max_seconds: float = 30.0          # the longest speech decoded (pre's max_seconds)


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
        self.codebook_size = self.codec.quantizer.quantizers[0].codebook.embed.shape[0]

    def input_limits(self) -> dict:
        return {"codes": (self.codebooks * int(self.params.max_seconds * self.codec.sizes.frame_rate),)}

    def one(self, req: Request) -> dict:
        codes = as_numpy(req.get("codes"))
        if not whole("codes", codes.size, self.codebooks):
            raise InvalidInput("codes", "is empty")
        ids_in_range("codes", codes, self.codebook_size)
        rms = float_scalar(req, "reference_rms", -1.0, math.inf)     # a clone takes its reference's loudness
        codes = torch.from_numpy(codes.astype(np.int64))
        wave = self.codec.decode(codes.view(1, self.codebooks, -1).to(self.codec.fc2.weight.device))[0]
        rate = self.codec.sample_rate
        wave = finish(wave.float().cpu().numpy(), rate, rms if rms >= 0 else None, self.params.remove_silence)
        return {"waveform": wave, "sample_rate": np.asarray([rate], np.int32),
                "speech": req.get("speech")}
