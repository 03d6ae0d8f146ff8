"""Chatterbox's steps (ensemble_configs/chatterbox_tts.yaml): pre -> t3 -> s3gen -> speech_post (the model:
python_backends/tts/chatterbox/t3.py, s3gen.py).

`chatterbox_pre`     speech inputs -> T3's text ids (normalised text between start / stop tokens), the
                     sampling settings as JSON, `speech` (seed drawn here when absent) and the voice: the
                     checkpoint's built-in one (conds.pt), or the voice of `reference_audio`, cloned here
                     on the CPU (python_backends/tts/chatterbox/voice.py): T3's speaker embedding and
                     prompt tokens, S3Gen's reference tokens, mel and x-vector. Bad requests fail here,
                     naming the field.
`chatterbox_t3`      every request of the batch in one decode loop (cond / uncond row pair per request,
                     left-padded prompts, transformers' KV cache); tokens come from the request's own
                     seeded generator, so they do not depend on the batch neighbours' draws.
`chatterbox_s3gen`   speech tokens -> 24 kHz waveform (flow matching, HiFT), request by request (every request
                     has its own length and noise); its noise comes from a generator seeded with the seed.

The package does not stream (generate returns the whole waveform), so a streamed request gets its audio
as one PCM chunk.
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass

import numpy as np
import torch

from triton_omni.runtime.errors import InvalidInput
from triton_omni.runtime.params import torch_dtype
from triton_omni.runtime.spec import TensorSpec
from triton_omni.runtime.step import Request, Step, StepContext, register, string_array
from triton_omni.tts.chatterbox.s3gen import CFM_STEPS, MELS, SAMPLE_RATE, S3Gen
from triton_omni.tts.chatterbox.t3 import (SPEECH_VOCAB, T3, T3_SIZES, Sampling, T3Job, TextTokenizer, Voice,
                                           generate_tokens, load_voice)
from triton_omni.tts.chatterbox.voice import S3GEN_CLIP_SECONDS, VoiceCloner
from triton_omni.tts.checks import finite, ids_in_range, whole
from triton_omni.tts.request import (AUDIO_CHUNK_OUTPUTS, SPEECH, SPEECH_INPUTS, Speech, as_numpy, parse_reference,
                                     parse_speech, reference_transcript, request_seed)

DEFAULT_VOICE = "default"
# sampling_parameters keys read (generate()'s arguments; max_tokens as for the other talkers) and their ranges
REF_TOKENS = S3GEN_CLIP_SECONDS * 25       # S3 tokens (25 a second) of S3Gen's reference clip at most
SAMPLING_RANGES = {"temperature": (0.0, 5.0), "top_p": (0.0, 1.0), "min_p": (0.0, 1.0),
                   "repetition_penalty": (0.1, 5.0), "cfg_weight": (0.0, 5.0), "exaggeration": (0.0, 5.0)}


def checkpoint_folder(ctx: StepContext, value: str):
    """The release folder has no config.json (the usual checkpoint marker): look for T3's weights."""
    folder = ctx.path(value)
    if not value or not (folder / "t3_cfg.safetensors").exists():
        raise FileNotFoundError(f"{ctx.model_name}: checkpoint folder {str(folder)!r} (parameter 'checkpoint') has "
                                "no t3_cfg.safetensors; build it or pass --checkpoint NAME=DIR to the converter")
    return folder


# the voice, pre -> t3 (speaker_emb, prompt_tokens) and pre -> s3gen (ref_*); ref_mel is [frames, 80] flattened
T3_VOICE = (TensorSpec("speaker_emb", "TYPE_FP32", (-1,), ragged=True),
            TensorSpec("prompt_tokens", "TYPE_INT32", (-1,), ragged=True))
S3GEN_VOICE = (TensorSpec("ref_tokens", "TYPE_INT32", (-1,), ragged=True),
               TensorSpec("ref_mel", "TYPE_FP32", (-1,), ragged=True),
               TensorSpec("ref_embedding", "TYPE_FP32", (-1,), ragged=True))


def sampling_settings(raw, name: str, max_tokens: int, extra: tuple[str, ...] = ()) -> dict:
    """generate()'s settings (SAMPLING_RANGES, defaults filled in) and max_tokens from the JSON object `raw`
    of input `name`, checked; `extra`: other keys the caller reads."""
    if not isinstance(raw, dict):
        raise InvalidInput(name, "expected a JSON object")
    allowed = (*extra, "max_tokens", *SAMPLING_RANGES)
    for key in raw:
        if key not in allowed:
            raise InvalidInput(f"{name}.{key}", f"does not apply to Chatterbox; read: {', '.join(allowed)}")
    out = asdict(Sampling())
    for key, (low, high) in SAMPLING_RANGES.items():
        value = raw.get(key, out[key])
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not low <= value <= high:
            raise InvalidInput(f"{name}.{key}", f"expected a number in [{low}, {high}], got {value!r}")
        out[key] = float(value)
    out["max_tokens"] = raw.get("max_tokens", max_tokens)
    if isinstance(out["max_tokens"], bool) or not isinstance(out["max_tokens"], int) or \
            not 1 <= out["max_tokens"] <= max_tokens:
        raise InvalidInput(f"{name}.max_tokens", f"expected an integer in [1, {max_tokens}], got {out['max_tokens']!r}")
    return out


def voice_tensors(voice: Voice, ref: dict) -> dict[str, np.ndarray]:
    f32 = lambda t: np.ascontiguousarray(as_numpy(t), dtype=np.float32).reshape(-1)  # noqa: E731
    i32 = lambda t: np.ascontiguousarray(as_numpy(t), dtype=np.int32).reshape(-1)    # noqa: E731
    return {"speaker_emb": f32(voice.speaker), "prompt_tokens": i32(voice.prompt_tokens),
            "ref_tokens": i32(ref["prompt_token"]), "ref_mel": f32(ref["prompt_feat"]),
            "ref_embedding": f32(ref["embedding"])}


@dataclass
class ChatterboxPreParams:
    checkpoint: str = ""
    max_text_chars: int = 4096
    max_tokens: int = 1000             # speech tokens per request (generate's max_new_tokens), 25 a second
    min_reference_seconds: float = 0.5
    max_reference_seconds: float = 30.0   # the voice encoder reads all of it (S3Gen 10 s, T3's tokens 6 s)


@register("chatterbox_pre")
class ChatterboxPre(Step):
    inputs = SPEECH_INPUTS
    outputs = (
        TensorSpec("text_ids", "TYPE_INT32", (-1,)),
        TensorSpec("sampling", "TYPE_STRING", (1,)),
        SPEECH,
        *(TensorSpec(t.name, t.dtype, t.dims) for t in T3_VOICE + S3GEN_VOICE),
    )
    Params = ChatterboxPreParams

    def __init__(self, ctx: StepContext):
        super().__init__(ctx)
        folder = checkpoint_folder(ctx, self.params.checkpoint)
        self.tokenizer = TextTokenizer(folder / "tokenizer.json")
        self.default_voice = voice_tensors(*load_voice(folder))
        try:
            self.cloner, self.no_cloning = VoiceCloner(folder), ""
        except (ValueError, KeyError, FileNotFoundError) as exc:      # a folder without the encoders' weights
            self.cloner, self.no_cloning = None, str(exc)

    def voice(self, req: Request) -> dict[str, np.ndarray]:
        """The built-in voice, or the voice of `reference_audio`. Chatterbox clones from the audio alone:
        a transcript beside it is not used (an uploaded voice may carry one); alone it is refused."""
        value = req.get("reference_audio")
        if value is None:
            if reference_transcript(req):
                raise InvalidInput("reference_text", "describes reference_audio, which is missing")
            return self.default_voice
        if not value.size or not any(len(v or b"") for v in value.reshape(-1)):
            raise InvalidInput("reference_audio", "is empty; leave it out for the built-in voice")
        if self.cloner is None:
            raise InvalidInput("reference_audio", f"this checkpoint cannot clone voices ({self.no_cloning})")
        p = self.params
        wave, _ = parse_reference(req, self.cloner.rate, p.min_reference_seconds, p.max_reference_seconds)
        return voice_tensors(*self.cloner.clone(wave))

    def sampling(self, req: Request) -> tuple[int, dict]:
        raw = req.json("sampling_parameters") or {}
        return request_seed(raw), sampling_settings(raw, "sampling_parameters", self.params.max_tokens, ("seed",))

    def one(self, req: Request) -> dict:
        speech = parse_speech(req, [DEFAULT_VOICE], DEFAULT_VOICE, self.params.max_text_chars)
        seed, sampling = self.sampling(req)
        ids = self.tokenizer.ids(speech.text)
        if len(ids) > 2048 + 2:                                   # T3's text position table
            raise InvalidInput("text", f"is too long: {len(ids) - 2} text tokens; at most 2048")
        return {"text_ids": np.asarray(ids, dtype=np.int32), "sampling": string_array(json.dumps(sampling)),
                "speech": Speech(seed, speech.response_format, speech.stream).tensor(), **self.voice(req)}


@dataclass
class ChatterboxT3Params:
    checkpoint: str = ""
    dtype: str = "float32"
    max_tokens: int = 1000             # speech tokens per request at most (pre's max_tokens)


@register("chatterbox_t3")
class ChatterboxT3(Step):
    inputs = (
        TensorSpec("text_ids", "TYPE_INT32", (-1,), ragged=True),
        TensorSpec("sampling", "TYPE_STRING", (1,)),
        SPEECH,
        *T3_VOICE,
    )
    outputs = (
        TensorSpec("speech_tokens", "TYPE_INT32", (-1,)),
        TensorSpec("finish_reason", "TYPE_STRING", (1,)),
        SPEECH,
    )
    Params = ChatterboxT3Params

    def __init__(self, ctx: StepContext):
        super().__init__(ctx)
        folder = checkpoint_folder(ctx, self.params.checkpoint)
        self.model = T3.load(folder, ctx.device, torch_dtype(self.params.dtype))

    def input_limits(self) -> dict:
        return {"text_ids": (T3_SIZES["max_text_tokens"] + 2,), "speaker_emb": (T3_SIZES["speaker_embed_size"],),
                "prompt_tokens": (T3_SIZES["max_speech_tokens"],)}     # T3's position tables

    def job(self, req: Request) -> T3Job:
        ids, speaker, prompt = (as_numpy(req.get(name)) for name in ("text_ids", "speaker_emb", "prompt_tokens"))
        ids_in_range("text_ids", ids, T3_SIZES["text_vocab"])
        if ids.size < 2:
            raise InvalidInput("text_ids", "expected the start and stop tokens around the text")
        if speaker.size != T3_SIZES["speaker_embed_size"]:
            raise InvalidInput("speaker_emb", f"expected {T3_SIZES['speaker_embed_size']} values, got {speaker.size}")
        finite("speaker_emb", speaker)
        if not prompt.size:
            raise InvalidInput("prompt_tokens", "is empty")
        ids_in_range("prompt_tokens", prompt, T3_SIZES["speech_vocab"])
        settings = sampling_settings(req.json("sampling") or {}, "sampling", self.params.max_tokens)
        max_tokens = settings.pop("max_tokens")
        voice = Voice(torch.from_numpy(speaker.astype(np.float32).reshape(1, -1)),
                      torch.from_numpy(prompt.astype(np.int64).reshape(1, -1)))
        return T3Job(ids.astype(np.int64).tolist(), Sampling(**settings), Speech.from_request(req).seed, max_tokens, voice)

    def execute(self, requests: list[Request]) -> list[dict | BaseException]:
        def run(reqs, jobs):
            for req, (tokens, reason) in zip(reqs, generate_tokens(self.model, None, jobs)):
                yield {"speech_tokens": np.asarray(tokens, dtype=np.int32), "finish_reason": string_array(reason),
                       "speech": req.get("speech")}
        return self.execute_jobs(requests, run)


@dataclass
class ChatterboxS3GenParams:
    checkpoint: str = ""
    dtype: str = "float32"
    cfm_steps: int = CFM_STEPS         # flow-matching Euler steps (the package's 10)
    max_tokens: int = 1000             # speech tokens per request at most (pre's max_tokens)


@register("chatterbox_s3gen")
class ChatterboxS3Gen(Step):
    inputs = (
        TensorSpec("speech_tokens", "TYPE_INT32", (-1,), ragged=True),
        TensorSpec("finish_reason", "TYPE_STRING", (1,)),
        SPEECH,
        *S3GEN_VOICE,
    )
    outputs = AUDIO_CHUNK_OUTPUTS
    Params = ChatterboxS3GenParams

    def __init__(self, ctx: StepContext):
        super().__init__(ctx)
        folder = checkpoint_folder(ctx, self.params.checkpoint)
        self.model = S3Gen.load(folder, ctx.device, torch_dtype(self.params.dtype))
        self.embedding_size = self.model.flow.spk_embed_affine_layer.in_features     # the x-vector's

    def input_limits(self) -> dict:
        return {"speech_tokens": (self.params.max_tokens,), "ref_tokens": (REF_TOKENS,),
                "ref_mel": (2 * REF_TOKENS * MELS,), "ref_embedding": (self.embedding_size,)}

    def reference(self, req: Request, tokens: int) -> dict:
        """S3Gen's reference from the request, checked against each other and the new `tokens`."""
        ref_tokens, mel, embedding = (as_numpy(req.get(name)) for name in ("ref_tokens", "ref_mel", "ref_embedding"))
        ids_in_range("ref_tokens", ref_tokens, SPEECH_VOCAB)
        frames = whole("ref_mel", mel.size, MELS, "mel frames")
        if frames > 2 * (ref_tokens.size + tokens):           # its frames lead the 2 a token the flow makes
            raise InvalidInput("ref_mel", f"{frames} frames; the reference's and new tokens make "
                                          f"{2 * (ref_tokens.size + tokens)}")
        if embedding.size != self.embedding_size:
            raise InvalidInput("ref_embedding", f"expected {self.embedding_size} values, got {embedding.size}")
        finite("ref_mel", mel)
        finite("ref_embedding", embedding)
        return {"prompt_token": torch.from_numpy(ref_tokens.astype(np.int64)).reshape(1, -1),
                "prompt_feat": torch.from_numpy(mel.astype(np.float32)).reshape(1, -1, MELS),
                "embedding": torch.from_numpy(embedding.astype(np.float32)).reshape(1, -1)}

    def one(self, req: Request) -> dict:
        tokens = as_numpy(req.get("speech_tokens"))
        ids_in_range("speech_tokens", tokens, SPEECH_VOCAB)
        ref = self.reference(req, tokens.size)
        tokens = torch.from_numpy(tokens.astype(np.int64).reshape(-1))
        if tokens.numel():
            wave = self.model.synthesize(tokens, ref, Speech.from_request(req).seed, self.params.cfm_steps).numpy()
        else:
            wave = np.zeros(0, np.float32)          # T3 stopped at once: no speech
        return {"waveform": wave, "sample_rate": np.asarray([SAMPLE_RATE], np.int32),
                "finish_reason": req.get("finish_reason"), "speech": req.get("speech")}
