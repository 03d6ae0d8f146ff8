"""The Qwen3-TTS ensemble's own steps (ensemble_configs/qwen3_tts.yaml): pre -> talker -> codec -> post.

`qwen3_tts_pre`      speech inputs -> the talker's inputs: the text's tokens (assistant_text), the speaker
                     (the request's `voice`: one of the checkpoint's preset speakers), sampling (the
                     release's defaults; the seed drawn here when absent, so a seeded request gets the
                     same audio streamed or not), `speech`. Bad requests fail here, naming the field.
                     A Base checkpoint clones the voice of `reference_audio` instead (no preset voices):
                     its x-vector, and with `reference_text` its codes and the transcript's tokens ("ICL"),
                     from the encoders of python_backends/tts/qwen3_tts_clone.py, run here on the CPU:
                     they are small and run once per request, and a bad clip fails only its request, in
                     the step that validates requests, with no extra step between pre and talker.
`qwen3_tts_talker`   `talker_frames` (the AR engine, frames of N codes) with a sink that shapes its
                     stream for a stateless codec, as the Orpheus talker does: a response goes out only
                     when a chunk can be played (`ChunkPlan.ready_end` grows) or at the end, and it
                     repeats the already-sent frames from the first one the next chunk's window needs.
                     Codes travel flattened ([frames * N], ragged) so requests batch in the codec.
`qwen3_tts_codec`    frames -> 24 kHz waveform with the 12 Hz speech tokenizer's decoder, windows of all
                     requests in the batch decoded together (same-length windows, `decode_batch` rows
                     per call: a window decodes to the same bits whichever requests share its batch).

Exactness. The decoder is fully causal (no lookahead, python_backends/tts/qwen3_tts_codec.py), so a
chunk [s, e) is decoded as the window [s - left, e) and its own samples are kept. `context_frames`
= 0 (the default) takes left from the decoder's receptive field (`context_frames()`: 27 frames for
the tiny config, 581 for the release one, ~46 s, mostly its sliding-window transformer): every kept
sample then equals the whole-utterance decode's sample up to float rounding (rope positions start
at the window, the transformer's sums run in another order). Streamed and non-streamed requests cut
the same chunks and decode the same windows (`ChunkPlan` is a pure function of frame counts), so the
streamed PCM equals the non-streamed PCM bit for bit. A smaller `context_frames` trades exactness
against the whole-utterance decode for cheaper windows (the reference's chunked_decode uses 25); the
streamed == non-streamed equality holds for any value.

ICL voice clones: the reference package decodes the clip's codes followed by the new frames and cuts the
clip's audio off; the talker sends the clip's last `left` frames as the first chunks' left context
(frames before 0), so those chunks decode as the package decodes them.

Not here: instructions (VoiceDesign / 1.7B CustomVoice instruct), a language choice (the talker's `auto`).
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from python_backends.ar.sampling import FIELD as SAMPLING, SamplingParams
from python_backends.runtime.errors import InvalidInput
from python_backends.runtime.spec import TensorSpec
from python_backends.runtime.step import Request, ResponseSink, Step, StepContext, register, string_array
from python_backends.text.tokenizer import load_tokenizer
from python_backends.tts.chunking import ChunkedCodec, ChunkPlan, Window
from python_backends.tts.qwen3_tts import assistant_text, reference_text
from python_backends.tts.qwen3_tts_codec import CodecDecoder, load_codec, read_codec_config
from python_backends.tts.qwen3_tts_steps import (REFERENCE_REPETITION_PENALTY, REFERENCE_SAMPLING, TalkerFrames,
                                                 TalkerFramesParams)
from python_backends.tts.request import SPEECH, SPEECH_INPUTS, Speech, parse_reference, parse_speech, reject_reference

MIN_AUDIO_FRAMES = 12           # a prompt must leave room for about a second of audio
ROLE_TOKENS, CLOSING_TOKENS = 3, 5
MIN_REFERENCE_SECONDS = 0.5     # a voice clone's reference clip: shorter says little about the voice


def speech_folder(ctx: StepContext, codec_checkpoint: str, checkpoint: str):
    """The speech tokenizer folder: `codec_checkpoint`, or the release folder's `speech_tokenizer/`."""
    if codec_checkpoint:
        return ctx.checkpoint(codec_checkpoint)
    return ctx.checkpoint(checkpoint) / "speech_tokenizer"


def codec_plan(folder, first: int, size: int, context: int = 0) -> ChunkPlan:
    """The chunk plan for a speech tokenizer folder (its config alone: layers built on the meta device).
    `context` 0: the decoder's receptive field."""
    if context <= 0:
        with torch.device("meta"):
            context, _ = CodecDecoder(read_codec_config(folder)["decoder_config"]).context_frames()
    return ChunkPlan(first, size, context, 0)


# --- pre ------------------------------------------------------------------------------------------
@dataclass
class Qwen3TTSPreParams:
    checkpoint: str = ""
    max_model_len: int = 4096
    default_voice: str = "vivian"       # a preset speaker of the CustomVoice releases (and the tiny one)
    max_text_chars: int = 4000
    max_tokens: int = 2048              # frames when the request sets none (~164 s at 12.5 Hz)
    max_reference_seconds: float = 30.0     # Base: the longest reference_audio taken


@register("qwen3_tts_pre")
class Qwen3TTSPre(Step):
    inputs = SPEECH_INPUTS
    outputs = (
        TensorSpec("input_ids", "TYPE_INT32", (-1,)),
        TensorSpec("speaker", "TYPE_STRING", (1,)),
        TensorSpec("sampling", "TYPE_STRING", (1,)),
        SPEECH,
        # a Base checkpoint's cloned voice (empty otherwise): x-vector [H]; with reference_text, the
        # reference's frames [F * N] and the tokens of reference_text(transcript)
        TensorSpec("speaker_embed", "TYPE_FP32", (-1,)),
        TensorSpec("ref_codes", "TYPE_INT32", (-1,)),
        TensorSpec("ref_ids", "TYPE_INT32", (-1,)),
    )
    Params = Qwen3TTSPreParams

    def __init__(self, ctx: StepContext):
        super().__init__(ctx)
        folder = ctx.checkpoint(self.params.checkpoint)
        raw = json.loads((folder / "config.json").read_text())
        self.config = raw["talker_config"]
        self.voices = sorted((self.config.get("spk_id") or {}).keys())
        self.cloner = None
        if raw.get("tts_model_type") == "base":
            from python_backends.tts.qwen3_tts_clone import VoiceCloner

            self.cloner, self.voices = VoiceCloner(folder), []
        elif not self.voices:
            raise ValueError(f"{folder} has no preset speakers (talker_config.spk_id): only CustomVoice and Base "
                             "checkpoints are served (no voice design yet)")
        elif self.params.default_voice.lower() not in self.voices:
            raise ValueError(f"default_voice {self.params.default_voice!r} is not among {self.voices}")
        self.tokenizer = load_tokenizer(folder)
        self.text_vocab = self.config["text_vocab_size"]

    def prompt_len(self, speaker: str) -> int:
        """Positions of the talker's prompt (Qwen3TTS.build_prompt, streaming text, no instruction):
        3 role tokens + the codec prefix (3, or 4 with a language tag: a dialect speaker's under
        `auto`) + speaker + pad + bos; the text then streams one token per frame."""
        dialect = (self.config.get("spk_is_dialect") or {}).get(speaker, False)
        return ROLE_TOKENS + (4 if dialect else 3) + 3

    def sampling(self, req: Request, prompt_len: int, text_len: int) -> dict:
        raw = req.json(SAMPLING) or {}
        if not isinstance(raw, dict):
            raise InvalidInput(SAMPLING, "expected a JSON object")
        for key in ("stop", "stop_token_ids"):
            if key in raw:
                raise InvalidInput(f"{SAMPLING}.{key}", "stop conditions do not apply to speech")
        penalty = raw.pop("repetition_penalty", REFERENCE_REPETITION_PENALTY)
        if isinstance(penalty, bool) or not isinstance(penalty, (int, float)) or penalty <= 0:
            raise InvalidInput(f"{SAMPLING}.repetition_penalty", f"must be a number > 0, got {penalty!r}")
        params = SamplingParams.from_dict({**REFERENCE_SAMPLING, **raw})
        p = self.params
        if params.max_tokens is None:
            params.max_tokens = min(p.max_tokens, p.max_model_len - prompt_len)
        params = params.resolve(prompt_len, p.max_model_len, self.text_vocab)
        return {**params.to_dict(), "repetition_penalty": float(penalty)}

    def clone(self, req: Request) -> dict:
        """A Base checkpoint's voice from the request (empty tensors for a CustomVoice one)."""
        empty = {"speaker_embed": np.zeros(0, np.float32), "ref_codes": np.zeros(0, np.int32),
                 "ref_ids": np.zeros(0, np.int32)}
        if self.cloner is None:
            reject_reference(req, self.voices)
            return empty
        p = self.params
        wave, transcript = parse_reference(req, self.cloner.rate, MIN_REFERENCE_SECONDS, p.max_reference_seconds)
        if len(transcript) > p.max_text_chars:
            raise InvalidInput("reference_text", f"is too long: {len(transcript)} characters; at most {p.max_text_chars}")
        out = {**empty, "speaker_embed": self.cloner.x_vector(wave).float().numpy()}
        if transcript:                  # ICL: the talker continues the reference
            out["ref_codes"] = self.cloner.codes(wave).numpy().astype(np.int32).reshape(-1)
            out["ref_ids"] = np.asarray(self.tokenizer(reference_text(transcript))["input_ids"], dtype=np.int32)
        return out

    def one(self, req: Request) -> dict:
        p = self.params
        default = p.default_voice.lower() if self.voices else ""
        speech = parse_speech(req, self.voices, default, p.max_text_chars)
        clone = self.clone(req)
        ids = self.tokenizer(assistant_text(speech.text))["input_ids"]
        text_len = len(ids) - ROLE_TOKENS - CLOSING_TOKENS
        prompt_len = self.prompt_len(speech.voice)
        frames = clone["ref_codes"].size // self.config["num_code_groups"]
        if frames:                      # ICL: [bos, reference frames] under transcript + text + eos; the rest streams
            prompt_len += frames
            text_len = max(0, len(clone["ref_ids"]) - ROLE_TOKENS - 2 + text_len + 1 - (1 + frames))
            if prompt_len + MIN_AUDIO_FRAMES > p.max_model_len:
                raise InvalidInput("reference_audio", f"is too long: its {frames} frames leave no room in the "
                                                      f"context ({p.max_model_len} frames)")
        fits = p.max_model_len - prompt_len - MIN_AUDIO_FRAMES
        if text_len > fits:
            raise InvalidInput("text", f"is too long: {text_len} tokens; at most {fits} fit (the context holds "
                                       f"{p.max_model_len} frames, the text streams one token per frame)")
        sampling = self.sampling(req, prompt_len, text_len)
        return {"input_ids": np.asarray(ids, dtype=np.int32),
                "speaker": string_array(speech.voice),
                "sampling": string_array(json.dumps(sampling)),
                "speech": Speech(sampling["seed"], speech.response_format, speech.stream).tensor(), **clone}


# --- talker -----------------------------------------------------------------------------------------
@dataclass
class Qwen3TTSTalkerParams(TalkerFramesParams):
    codec_checkpoint: str = ""      # the speech tokenizer folder ("": the checkpoint's speech_tokenizer/)
    first_chunk_frames: int = 3
    chunk_frames: int = 12
    context_frames: int = 0         # left context per chunk window; 0: the decoder's receptive field


class FrameChunkSink(ResponseSink):
    """One request's sink: talker_frames' responses -> codec-ready ones (frames flattened)."""

    def __init__(self, inner: ResponseSink, plan: ChunkPlan, streaming: bool, num_codes: int, reference=None):
        self.inner, self.plan, self.streaming, self.n = inner, plan, streaming, num_codes
        self.frames: list[np.ndarray] = []     # every frame released so far, [N] each
        self.sent = 0                          # how many of them went out
        # an ICL voice clone's reference frames, the last `left` of them: frames -len(ref)..-1
        ref = np.zeros(0) if reference is None else reference.cpu().numpy() if hasattr(reference, "cpu") else reference
        ref = np.asarray(ref, np.int32).reshape(-1, num_codes)
        self.ref = list(ref[len(ref) - min(len(ref), plan.left):])

    def send(self, outputs: dict[str, Any], final: bool = False) -> None:
        if "codes" not in outputs:             # an abort's empty acknowledgement
            self.inner.send(outputs, final)
            return
        self.frames += list(np.asarray(outputs["codes"], dtype=np.int32).reshape(-1, self.n))
        total = len(self.frames)
        if not final and self.plan.ready_end(total) <= self.plan.ready_end(self.sent):
            return                             # nothing new to play yet
        lo = -len(self.ref)                    # context_start, reaching into the reference
        start = max(lo, self.plan.ready_end(self.sent) - self.plan.left) if self.streaming else lo
        known = self.ref + self.frames
        codes = np.stack(known[start - lo:]) if total > start else np.zeros((0, self.n), np.int32)
        self.inner.send({
            "codes": codes.reshape(-1),
            "num_context": np.asarray([self.sent - start], dtype=np.int32),
            "completion_tokens": np.asarray([total], dtype=np.int32),
            "finish_reason": outputs["finish_reason"],
            "speech": outputs["speech"],
        }, final)
        self.sent = total

    def error(self, exc: BaseException) -> None:
        self.inner.error(exc)

    def is_cancelled(self) -> bool:
        return self.inner.is_cancelled()


@register("qwen3_tts_talker")
class Qwen3TTSTalker(TalkerFrames):
    # what pre sends (and `stream`, the ensemble's): no language / instruction / non_streaming inputs, so
    # the ensemble exposes only the speech route's tensors
    inputs = tuple(s for s in TalkerFrames.inputs if s.name not in ("instruct_ids", "language", "non_streaming"))
    outputs = (
        TensorSpec("codes", "TYPE_INT32", (-1,)),             # [frames * N] from the window's first frame
        TensorSpec("num_context", "TYPE_INT32", (1,)),        # frames of them sent before
        TensorSpec("completion_tokens", "TYPE_INT32", (1,)),  # frames so far
        TensorSpec("finish_reason", "TYPE_STRING", (1,)),
        SPEECH,
    )
    Params = Qwen3TTSTalkerParams

    def __init__(self, ctx: StepContext):
        super().__init__(ctx)
        p = self.params
        self.plan = codec_plan(speech_folder(ctx, p.codec_checkpoint, p.checkpoint), p.first_chunk_frames,
                               p.chunk_frames, p.context_frames)

    def submit(self, request: Request, sink: ResponseSink) -> None:
        if self.handle_abort(request, sink):
            return
        sink = FrameChunkSink(sink, self.plan, bool(request.scalar("stream", False)), self.model.num_codes,
                              request.get("ref_codes"))
        super().submit(request, sink)


# --- codec ------------------------------------------------------------------------------------------
@dataclass
class Qwen3TTSCodecParams:
    checkpoint: str = ""
    codec_checkpoint: str = ""
    dtype: str = "float32"
    first_chunk_frames: int = 3
    chunk_frames: int = 12
    context_frames: int = 0
    decode_batch: int = 4           # windows per decoder call (fixed, see the module docstring)
    pad_rows: str = "fixed"         # "fixed" | "pow2" (see ChunkedCodec)


@register("qwen3_tts_codec")
class Qwen3TTSCodecStep(ChunkedCodec):
    inputs = (
        TensorSpec("codes", "TYPE_INT32", (-1,), ragged=True),
        TensorSpec("num_context", "TYPE_INT32", (1,)),
        TensorSpec("completion_tokens", "TYPE_INT32", (1,)),
        TensorSpec("finish_reason", "TYPE_STRING", (1,)),
        SPEECH,
    )
    Params = Qwen3TTSCodecParams

    def __init__(self, ctx: StepContext):
        super().__init__(ctx)
        p = self.params
        folder = speech_folder(ctx, p.codec_checkpoint, p.checkpoint)
        self.codec = load_codec(folder, ctx.device, self.dtype)
        self.sample_rate, self.frame_samples = self.codec.sample_rate, self.codec.frame_samples
        self.n = self.codec.num_quantizers
        self.codebook_size = self.codec.decoder.config["codebook_size"]
        self.plan = codec_plan(folder, p.first_chunk_frames, p.chunk_frames, p.context_frames)

    def windows(self, index: int, req: Request) -> list[Window]:
        codes = req.get("codes")
        codes = codes.cpu().numpy() if hasattr(codes, "cpu") else np.asarray(codes)
        codes = codes.reshape(-1, self.n)
        n_ctx, total = int(req.scalar("num_context")), int(req.scalar("completion_tokens"))
        reason = req.string("finish_reason") or ""
        if reason == "cancelled":
            return []
        before = total - (codes.shape[0] - n_ctx)
        first = before - n_ctx                          # frame index of codes[0]
        out = []
        for order, chunk in enumerate(self.plan.chunks(before, total, final=bool(reason))):
            start, end = self.plan.window(chunk, total)
            if first < 0:                       # reference frames before frame 0 (ICL): context like any other
                start = max(chunk[0] - self.plan.left, first)
            if start < first:
                raise RuntimeError(f"the talker sent context from frame {first}, the window needs {start}: "
                                   "talker and codec disagree on the chunk plan")
            out.append(Window(index, order, codes[start - first:end - first], start,
                              (chunk[0] - start, chunk[1] - start)))
        return out

    def decode_rows(self, rows: list[Window]) -> np.ndarray:
        codes = np.stack([w.data for w in rows]).astype(np.int64).clip(0, self.codebook_size - 1)  # ignore_eos
        return self.codec.decode_window(torch.from_numpy(codes).to(self.ctx.device)).float().cpu().numpy()
