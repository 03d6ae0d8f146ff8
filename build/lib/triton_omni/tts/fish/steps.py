"""Fish S2-Pro's steps (ensemble_configs/fish_s2_tts.yaml): pre -> talker -> codec -> speech_post.

`fish_s2_pre`     speech inputs -> the slow model's prompt ids (model.prompt_ids: the release's
                  conversation) flattened [T * (N + 1)], sampling (the release's defaults: temperature
                  1.0, top_p 0.9, top_k 30; the seed drawn here when absent, so a seeded request gets
                  the same audio streamed or not) and `speech`. Voice cloning: `reference_audio` (any
                  file PyAV reads) with its transcript `reference_text` (required: without one the
                  release ignores the clip) -> the clip's codes (codec.FishCodecEncoder, on the
                  CPU once per request), which go into the prompt after the transcript; the talker
                  and codec see only a longer prompt. Bad requests fail here, naming the field.
`fish_s2_talker`  a frame talker (tts/frame_talker.py: the AR engine; frames of N + 1 ids, model.py)
                  with a sink shaping its stream for the codec: a response goes out only when a chunk can be played
                  (`ChunkPlan.ready_end` grows) or at the end, and carries the chunk's codes with the
                  frames of left context its decode window needs (`num_context`), so the codec keeps
                  no state.
`fish_s2_codec`   codes -> 44.1 kHz waveform (codec.py), stateless: a chunk [s, e) decodes the
                  window [s - context_frames, e) and keeps its own samples; windows of one length from
                  all requests in a Triton batch decode together (`ChunkedCodec`). Chunks are a pure
                  function of frame counts, so streamed audio equals non-streamed audio for a seed.

Exactness against one whole-utterance decode: the codec is causal, so a chunk needs no lookahead,
but its windowed transformer reaches back 8 x 127 frames (release sizes) and each window's rope
positions restart at 0 (the tables are bfloat16, so shifted positions round differently): with
`context_frames` of left context, samples of chunks after the first differ slightly from a whole
decode (tests/test_tts_fish.py measures it on the tiny checkpoint); a stream up to `context_frames`
+ `first_chunk_frames` frames long decodes exactly. A stateful decoder (as Qwen3-TTS's) would be exact.
The clip is read as the release reads it: decoded at its own rate, resampled to 44.1 kHz by
media.audio_signal.resample (torchaudio's kernel, which the release uses), encoded in float32 (the release runs
its codec in bfloat16 on a GPU). Except: a stereo clip is made mono by FFmpeg's downmix, (L + R) / sqrt(2),
where the release averages the channels (3 dB quieter). The encoder runs on the CPU: at the release's
sizes (~207M parameters) a 5 s clip takes seconds there.
Not served yet: the release's splitting of speaker-tagged text into several generations (the text
is one turn here); several reference clips in one request.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from triton_omni.ar.sampling import FIELD as SAMPLING, SamplingParams
from triton_omni.runtime.errors import InvalidInput
from triton_omni.runtime.spec import TensorSpec
from triton_omni.runtime.step import Request, ResponseSink, Step, StepContext, register, string_array
from triton_omni.text.tokenizer import load_tokenizer
from triton_omni.tts.checks import whole
from triton_omni.tts.chunking import ChunkedCodec, ChunkPlan, Window
from triton_omni.tts.fish.codec import load_codec, load_codec_encoder
from triton_omni.tts.fish.model import DEFAULT_SAMPLING, FishConfig, FishPrompt, fish_engine, load_fish, prompt_ids
from triton_omni.tts.frame_talker import FrameReply, FrameTalker, TalkerFramesParams
from triton_omni.tts.request import (SPEECH, SPEECH_INPUTS, Speech, has_reference, parse_speech, read_reference,
                                     speech_tensor)

VOICES = ["default"]            # the model's own voice (no preset speakers in the release)
MIN_AUDIO_FRAMES = 12           # a prompt must leave room for about half a second of audio


def codec_path(ctx: StepContext, codec_checkpoint: str, checkpoint: str):
    """codec.pth: `codec_checkpoint` (a file), or the release folder's codec.pth."""
    path = ctx.path(codec_checkpoint) if codec_checkpoint else ctx.checkpoint(checkpoint) / "codec.pth"
    if not path.is_file():
        raise FileNotFoundError(f"{ctx.model_name}: codec checkpoint {str(path)!r} is not a file")
    return path


# --- pre ----------------------------------------------------------------------------------------------
@dataclass
class FishPreParams:
    checkpoint: str = ""
    codec_checkpoint: str = ""          # codec.pth ("": the checkpoint folder's); its encoder clones voices
    max_model_len: int = 4096
    max_text_chars: int = 4000
    max_tokens: int = 2048              # frames when the request sets none (~95 s at 21.5 Hz)
    min_reference_seconds: float = 0.5
    max_reference_seconds: float = 30.0  # ~650 frames of the prompt


@register("fish_s2_pre")
class FishPre(Step):
    inputs = SPEECH_INPUTS
    outputs = (
        TensorSpec("input_ids", "TYPE_INT32", (-1,)),      # [T * (N + 1)]: per position the main id, N codes
        TensorSpec("sampling", "TYPE_STRING", (1,)),
        SPEECH,
    )
    Params = FishPreParams

    def __init__(self, ctx: StepContext):
        super().__init__(ctx)
        p = self.params
        folder = ctx.checkpoint(p.checkpoint)
        self.tokenizer = load_tokenizer(folder)
        self.config = FishConfig.from_folder(folder, self.tokenizer)
        try:            # float32 on the CPU, once per clone; a codec.pth without the encoder still speaks
            self.encoder, self.no_cloning = load_codec_encoder(codec_path(ctx, p.codec_checkpoint, p.checkpoint)), ""
        except (KeyError, ValueError, FileNotFoundError) as exc:
            self.encoder, self.no_cloning = None, str(exc)

    def sampling(self, req: Request, prompt_len: int) -> dict:
        raw = req.json(SAMPLING) or {}
        if not isinstance(raw, dict):
            raise InvalidInput(SAMPLING, "expected a JSON object")
        for key in ("stop", "stop_token_ids", "min_tokens", "ignore_eos"):
            if key in raw:
                raise InvalidInput(f"{SAMPLING}.{key}", "does not apply to this speech model")
        params = SamplingParams.from_dict({**DEFAULT_SAMPLING, **raw})
        p = self.params
        if params.max_tokens is None:
            params.max_tokens = min(p.max_tokens, p.max_model_len - prompt_len)
        return params.resolve(prompt_len, p.max_model_len, self.config.slow.vocab_size).to_dict()

    def reference(self, req: Request) -> tuple[str, torch.Tensor] | None:
        """The voice to clone: (transcript, the clip's codes [N, F]), or None without one."""
        if not has_reference(req):
            return None
        if self.encoder is None:
            raise InvalidInput("reference_audio", f"this checkpoint cannot clone voices ({self.no_cloning})")
        p = self.params
        wave, transcript = read_reference(req, self.encoder.sample_rate, p.min_reference_seconds,
                                          p.max_reference_seconds, p.max_text_chars,
                                          "without one the model does not clone")
        return transcript, self.encoder.encode(wave)

    def one(self, req: Request) -> dict:
        p = self.params
        speech = parse_speech(req, VOICES, VOICES[0], p.max_text_chars)
        n = self.config.num_codebooks
        ids = prompt_ids(self.tokenizer, speech.text, n)
        fits = p.max_model_len - MIN_AUDIO_FRAMES
        if len(ids) > fits:
            raise InvalidInput("text", f"is too long: the prompt has {len(ids)} tokens; at most {fits} fit "
                                       f"(the context holds {p.max_model_len}, with room left for audio)")
        reference = self.reference(req)
        if reference is not None:
            ids = prompt_ids(self.tokenizer, speech.text, n, reference, self.config.semantic_begin)
            if len(ids) > fits:
                raise InvalidInput("reference_audio", f"is too long: with its {reference[1].shape[1]} frames and "
                                                      f"transcript the prompt has {len(ids)} positions; at most "
                                                      f"{fits} fit")
        sampling = self.sampling(req, len(ids))
        return {"input_ids": ids.numpy().astype(np.int32).reshape(-1),
                "sampling": string_array(json.dumps(sampling)),
                "speech": Speech(sampling["seed"], speech.response_format, speech.stream).tensor()}


# --- talker -------------------------------------------------------------------------------------------
@dataclass
class FishTalkerParams(TalkerFramesParams):
    first_chunk_frames: int = 4
    chunk_frames: int = 16
    context_frames: int = 64


class FishChunkSink(ResponseSink):
    """One request's sink: talker_frames' responses -> the codec's (whole chunks of codes, with the
    frames of left context their windows need)."""

    def __init__(self, inner: ResponseSink, plan: ChunkPlan, num_codebooks: int, streaming: bool):
        self.inner, self.plan, self.n, self.streaming = inner, plan, num_codebooks, streaming
        self.frames: list[np.ndarray] = []     # codes of every frame released so far, [N] each
        self.sent = 0

    def send(self, outputs: dict[str, Any], final: bool = False) -> None:
        if "codes" not in outputs:             # an abort's empty acknowledgement
            self.inner.send(outputs, final)
            return
        new = np.asarray(outputs["codes"], dtype=np.int32).reshape(-1, self.n + 1)[:, 1:]   # drop the main ids
        self.frames += list(new)
        if not final and self.plan.ready_end(len(self.frames)) <= self.plan.ready_end(self.sent):
            return                             # nothing new to play yet
        start = self.plan.context_start(self.sent) if self.streaming else 0
        frames = self.frames[start:]
        self.inner.send({
            "codes": (np.stack(frames) if frames else np.zeros((0, self.n), np.int32)).reshape(-1),
            "num_context": np.asarray([self.sent - start], dtype=np.int32),
            "completion_tokens": np.asarray([len(self.frames)], dtype=np.int32),
            "finish_reason": outputs["finish_reason"],
            "speech": outputs["speech"],
        }, final)
        self.sent = len(self.frames)

    def error(self, exc: BaseException) -> None:
        self.inner.error(exc)

    def is_cancelled(self) -> bool:
        return self.inner.is_cancelled()


@register("fish_s2_talker")
class FishTalker(FrameTalker):
    outputs = (
        TensorSpec("codes", "TYPE_INT32", (-1,)),             # [frames * N]: context frames, then new ones
        TensorSpec("num_context", "TYPE_INT32", (1,)),        # frames of left context leading `codes`
        TensorSpec("completion_tokens", "TYPE_INT32", (1,)),  # frames so far
        TensorSpec("finish_reason", "TYPE_STRING", (1,)),
        SPEECH,
    )
    Params = FishTalkerParams
    load_model = staticmethod(load_fish)        # FrameTalker.make_engine builds the engine with these
    model_engine = staticmethod(fish_engine)

    def __init__(self, ctx: StepContext):
        super().__init__(ctx)
        p = self.params
        self.plan = ChunkPlan(p.first_chunk_frames, p.chunk_frames, p.context_frames, 0)

    def input_limits(self) -> dict:
        return {"input_ids": (self.params.max_model_len * self.model.num_codes,)}   # prompt positions of N + 1 ids

    def submit(self, request: Request, sink: ResponseSink) -> None:
        if self.handle_abort(request, sink):
            return
        c, width = self.model.config, self.model.num_codes
        ids = request.get("input_ids")
        if ids is None or ids.ndim != 1 or ids.size == 0 or ids.size % width:
            raise InvalidInput("input_ids", f"expected prompt positions of {width} ids each (model.prompt_ids)")
        ids = torch.as_tensor(np.asarray(ids, dtype=np.int64)).reshape(-1, width)
        if ((ids[:, 0] < 0) | (ids[:, 0] >= c.slow.vocab_size)).any() or ((ids[:, 1:] < 0) |
                                                                           (ids[:, 1:] >= c.codebook_size)).any():
            raise InvalidInput("input_ids", "has ids out of range")
        raw = request.json("sampling") or {}
        params = SamplingParams.from_dict({**DEFAULT_SAMPLING, **raw})
        # the model filters with top-k / top-p on raw logits before temperature, as the release does;
        # the engine only applies the temperature and draws
        prompt = FishPrompt(ids, params.temperature, params.top_p, params.top_k)
        params.top_p, params.top_k = 1.0, 0
        streaming = bool(request.scalar("stream", False))
        sink = FishChunkSink(sink, self.plan, c.num_codebooks, streaming)
        reply = FrameReply(sink, None, streaming, len(prompt), speech=speech_tensor(request))
        self.start(request, reply, prompt, params)


# --- codec --------------------------------------------------------------------------------------------
@dataclass
class FishCodecParams:
    checkpoint: str = ""
    codec_checkpoint: str = ""      # codec.pth ("": the checkpoint folder's)
    max_model_len: int = 4096       # the talker's context in frames: no reply has more
    dtype: str = "float32"
    first_chunk_frames: int = 4
    chunk_frames: int = 16
    context_frames: int = 64
    decode_batch: int = 4
    pad_rows: str = "fixed"


@register("fish_s2_codec")
class FishCodecStep(ChunkedCodec):
    inputs = (
        TensorSpec("codes", "TYPE_INT32", (-1,), ragged=True),
        TensorSpec("num_context", "TYPE_INT32", (1,)),
        TensorSpec("completion_tokens", "TYPE_INT32", (1,)),
        TensorSpec("finish_reason", "TYPE_STRING", (1,)),
        SPEECH,
    )
    Params = FishCodecParams

    def __init__(self, ctx: StepContext):
        super().__init__(ctx)
        p = self.params
        self.codec = load_codec(codec_path(ctx, p.codec_checkpoint, p.checkpoint), ctx.device, self.dtype)
        self.sample_rate, self.frame_samples = self.codec.sample_rate, self.codec.frame_samples
        self.n = self.codec.num_codebooks
        self.plan = ChunkPlan(p.first_chunk_frames, p.chunk_frames, p.context_frames, 0)

    def input_limits(self) -> dict:
        return {"codes": (self.params.max_model_len * self.n,)}    # a non-streamed reply's frames, all at once

    def windows(self, index: int, req: Request) -> list[Window]:
        codes = req.get("codes")
        codes = codes.cpu().numpy() if hasattr(codes, "cpu") else np.asarray(codes)
        # out-of-range codes are clamped by the codec, as the release does: no range to check
        codes = codes.reshape(whole("codes", codes.size, self.n), self.n)
        return self.plan_windows(index, req, codes, 1, self.params.max_model_len)

    def decode_rows(self, rows: list[Window]) -> np.ndarray:
        codes = torch.from_numpy(np.stack([w.data for w in rows]).astype(np.int64)).transpose(1, 2)
        return self.codec.decode(codes.to(self.ctx.device)).float().cpu().numpy()
