"""The Qwen3-TTS ensemble's own steps (ensemble_configs/qwen3_tts.yaml): pre -> talker -> codec -> post.

`qwen3_tts_pre`      speech inputs -> the talker's inputs: the text's tokens (assistant_text), the speaker
                     (the request's `voice`: one of the checkpoint's preset speakers), sampling (the
                     release's defaults; the seed drawn here when absent, so a seeded request gets the
                     same audio streamed or not), `speech`. Bad requests fail here, naming the field.
                     A Base checkpoint clones the voice of `reference_audio` instead (no preset voices):
                     its x-vector, and with `reference_text` its codes and the transcript's tokens ("ICL"),
                     from the encoders of python_backends/tts/qwen3_tts/clone.py, run here on the CPU:
                     they are small and run once per request, and a bad clip fails only its request, in
                     the step that validates requests, with no extra step between pre and talker.
`qwen3_tts_talker`   `talker_frames` (the AR engine, frames of N codes) with a sink that shapes its
                     stream for the codec: a response goes out only when a chunk can be played
                     (`ChunkPlan.ready_end` grows) or at the end, and carries the new frames of its whole
                     chunks only (flattened, [frames * N], ragged so requests batch in the codec), the
                     request's `stream_id` (unique, drawn here) and `first_frame`, the index of its first
                     frame; `finish_reason` marks the stream's last response.
`qwen3_tts_codec`    frames -> 24 kHz waveform with the 12 Hz speech tokenizer's decoder, stateful
                     (python_backends/tts/qwen3_tts/codec_stream.py): every frame is decoded once. The
                     one codec instance (one on purpose: a stream's chunks must decode in order) keeps
                     each live stream's state as a row of one preallocated state (`max_streams` rows),
                     decodes the chunks of all streams in a Triton batch together (streams at different
                     points share a call: the rows only share the chunk length), and frees a row after
                     its stream's last chunk, or after `stream_idle_s` without a chunk (a cancelled
                     stream never sends its last one). On a GPU each call shape is one CUDA graph
                     (`cuda_graphs`; StatePool in python_backends/tts/qwen3_tts/codec_stream.py).

Exactness. The decoder is fully causal (no lookahead) and a stream's state holds all the past still
contributes, so each chunk's samples equal the whole-utterance decode's up to float rounding (the sums
run over other lengths). Chunks are a pure function of frame counts (`ChunkPlan`) and the codec decodes
a response's chunks one after another (a non-streamed response: all of them; two responses of one
stream in one Triton batch: in order, a round each), so a streamed and a non-streamed request pass
through the same decoder calls chunk for chunk. A row decodes alike whatever its neighbours and its
place in a call, but on the CPU a convolution's rounding depends on the call's batch size: `pad_rows`
"fixed" pads every call to `decode_batch` rows (copies of a row), so the streamed PCM equals the
non-streamed PCM bit for bit whichever requests share the calls. "pow2" pads to the next power of two
only (a lone stream decodes 1 row): samples may then differ in their last bits with how many streams
share a call.

ICL voice clones: the package decodes the clip's codes followed by the new frames and cuts the clip's
audio off. The talker's first response starts with the clip's frames (frames -len(clip)..-1); the codec
decodes them first, from a fresh state, and keeps the state, not their audio.

Requests may choose the text's `language` (else auto, the talker's guess) and, on a 1.7B CustomVoice
checkpoint, give `instructions` (how to speak). Not here: VoiceDesign checkpoints.
"""
from __future__ import annotations

import json
import math
import time
import uuid
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from triton_omni.ar.sampling import FIELD as SAMPLING, SamplingParams
from triton_omni.runtime.errors import InvalidInput, Unavailable
from triton_omni.runtime.params import torch_dtype
from triton_omni.runtime.spec import TensorSpec
from triton_omni.runtime.step import Request, ResponseSink, Step, StepContext, register, string_array
from triton_omni.text.tokenizer import load_tokenizer
from triton_omni.tts.checks import int_scalar, whole
from triton_omni.tts.chunking import ChunkPlan, bit_stable_on_cpu
from triton_omni.tts.frame_talker import TalkerFramesParams
from triton_omni.tts.qwen3_tts.codec import load_codec
from triton_omni.tts.qwen3_tts.codec_stream import StatePool, StreamingDecoder
from triton_omni.tts.qwen3_tts.model import assistant_text, instruct_text, language_id, languages, reference_text
from triton_omni.tts.qwen3_tts.talker import REFERENCE_REPETITION_PENALTY, REFERENCE_SAMPLING, TalkerFrames
from triton_omni.tts.request import (AUDIO_CHUNK_OUTPUTS, SPEECH, SPEECH_INPUTS, Speech, parse_reference,
                                     parse_speech, reject_reference)

MIN_AUDIO_FRAMES = 12           # a prompt must leave room for about a second of audio
ROLE_TOKENS, CLOSING_TOKENS = 3, 5
MIN_REFERENCE_SECONDS = 0.5     # a voice clone's reference clip: shorter says little about the voice
MAX_STREAM_ID = 128             # the talker's are 32 hex digits


def speech_folder(ctx: StepContext, codec_checkpoint: str, checkpoint: str):
    """The speech tokenizer folder: `codec_checkpoint`, or the release folder's `speech_tokenizer/`."""
    if codec_checkpoint:
        return ctx.checkpoint(codec_checkpoint)
    return ctx.checkpoint(checkpoint) / "speech_tokenizer"


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
        TensorSpec("language", "TYPE_STRING", (1,)),
        TensorSpec("instruct_ids", "TYPE_INT32", (-1,)),       # tokens of instruct_text(instructions); [] for none
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
            from triton_omni.tts.qwen3_tts.clone import VoiceCloner

            self.cloner, self.voices = VoiceCloner(folder), []
        elif not self.voices:
            raise ValueError(f"{folder} has no preset speakers (talker_config.spk_id): only CustomVoice and Base "
                             "checkpoints are served (no voice design yet)")
        elif self.params.default_voice.lower() not in self.voices:
            raise ValueError(f"default_voice {self.params.default_voice!r} is not among {self.voices}")
        self.tokenizer = load_tokenizer(folder)
        self.text_vocab = self.config["text_vocab_size"]
        self.languages = languages(self.config)
        # instructions: the 1.7B CustomVoice release (the reference drops them for 0.6B, and voice
        # clones have none): refused where they would be ignored
        self.takes_instructions = self.cloner is None and raw.get("tts_model_size") != "0b6"

    def prompt_len(self, speaker: str, language: str, instruct_tokens: int) -> int:
        """Positions of the talker's prompt (Qwen3TTS.build_prompt, streaming text): the instruction's
        tokens + 3 role tokens + the codec prefix (3, or 4 with a language tag: a language chosen, or a
        dialect speaker's under auto / Chinese) + speaker + pad + bos; the text then streams one token
        per frame."""
        tagged = language_id(self.config, language or "auto", speaker) is not None
        return instruct_tokens + ROLE_TOKENS + (4 if tagged else 3) + 3

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
        speech = parse_speech(req, self.voices, default, p.max_text_chars, languages=self.languages,
                              instructions=self.takes_instructions)
        clone = self.clone(req)
        ids = self.tokenizer(assistant_text(speech.text))["input_ids"]
        instruct = self.tokenizer(instruct_text(speech.instructions))["input_ids"] if speech.instructions else []
        text_len = len(ids) - ROLE_TOKENS - CLOSING_TOKENS
        prompt_len = self.prompt_len(speech.voice, speech.language, len(instruct))
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
                "language": string_array(speech.language or "auto"),
                "instruct_ids": np.asarray(instruct, dtype=np.int32),
                "sampling": string_array(json.dumps(sampling)),
                "speech": Speech(sampling["seed"], speech.response_format, speech.stream).tensor(), **clone}


# --- talker -----------------------------------------------------------------------------------------
@dataclass
class Qwen3TTSTalkerParams(TalkerFramesParams):
    first_chunk_frames: int = 3
    chunk_frames: int = 12


class FrameChunkSink(ResponseSink):
    """One request's sink: talker_frames' responses -> the codec's (whole chunks of new frames, flattened)."""

    def __init__(self, inner: ResponseSink, plan: ChunkPlan, num_codes: int, reference=None):
        self.inner, self.plan, self.n = inner, plan, num_codes
        self.stream_id = string_array(uuid.uuid4().hex)
        self.frames: list[np.ndarray] = []     # every frame released so far, [N] each
        self.sent = 0                          # how many of them went out (a chunk boundary until the end)
        # an ICL voice clone's reference frames: they lead the first response, as frames -len(ref)..-1
        ref = np.zeros(0) if reference is None else reference.cpu().numpy() if hasattr(reference, "cpu") else reference
        self.ref = list(np.asarray(ref, np.int32).reshape(-1, num_codes))

    def send(self, outputs: dict[str, Any], final: bool = False) -> None:
        if "codes" not in outputs:             # an abort's empty acknowledgement
            self.inner.send(outputs, final)
            return
        self.frames += list(np.asarray(outputs["codes"], dtype=np.int32).reshape(-1, self.n))
        end = len(self.frames) if final else self.plan.ready_end(len(self.frames))
        if not final and end <= self.sent:
            return                             # nothing new to play yet
        frames = self.ref + self.frames[self.sent:end]
        first, self.ref = self.sent - len(self.ref), []
        self.inner.send({
            "codes": (np.stack(frames) if frames else np.zeros((0, self.n), np.int32)).reshape(-1),
            "stream_id": self.stream_id,
            "first_frame": np.asarray([first], dtype=np.int32),
            "finish_reason": outputs["finish_reason"],
            "speech": outputs["speech"],
        }, final)
        self.sent = end

    def error(self, exc: BaseException) -> None:
        self.inner.error(exc)

    def is_cancelled(self) -> bool:
        return self.inner.is_cancelled()


@register("qwen3_tts_talker")
class Qwen3TTSTalker(TalkerFrames):
    # what pre sends (and `stream`, the ensemble's): no non_streaming input (streamed and non-streamed
    # requests share one prompt layout, so their audio is equal)
    inputs = tuple(s for s in TalkerFrames.inputs if s.name != "non_streaming")
    outputs = (
        TensorSpec("codes", "TYPE_INT32", (-1,)),             # [frames * N]: whole chunks of new frames
        TensorSpec("stream_id", "TYPE_STRING", (1,)),         # the codec keeps the stream's decoder state under it
        TensorSpec("first_frame", "TYPE_INT32", (1,)),        # index of codes' first frame (< 0: a clone's reference)
        TensorSpec("finish_reason", "TYPE_STRING", (1,)),     # "" until the stream's last response
        SPEECH,
    )
    Params = Qwen3TTSTalkerParams

    def __init__(self, ctx: StepContext):
        super().__init__(ctx)
        self.plan = ChunkPlan(self.params.first_chunk_frames, self.params.chunk_frames, 0, 0)

    def submit(self, request: Request, sink: ResponseSink) -> None:
        if self.handle_abort(request, sink):
            return
        ref = request.get("ref_codes")
        if ref is not None:                     # the sink takes the reference's frames before the talker checks them
            whole("ref_codes", math.prod(ref.shape), self.model.num_codes)
        super().submit(request, FrameChunkSink(sink, self.plan, self.model.num_codes, ref))


# --- codec ------------------------------------------------------------------------------------------
@dataclass
class Qwen3TTSCodecParams:
    checkpoint: str = ""
    codec_checkpoint: str = ""      # the speech tokenizer folder ("": the checkpoint's speech_tokenizer/)
    max_model_len: int = 4096       # the talker's context in frames (a clone's reference included): no stream is longer
    dtype: str = "float32"
    first_chunk_frames: int = 3
    chunk_frames: int = 12
    decode_batch: int = 4           # rows per decoder call
    pad_rows: str = "fixed"         # "fixed" | "pow2": see the module docstring
    max_streams: int = 32           # decoder states kept at once (a row each, allocated at start)
    stream_idle_s: float = 60.0     # a state without a chunk for this long is dropped
    cuda_graphs: bool = False       # each call shape of up to max(first_chunk_frames, chunk_frames) frames
                                    # as one CUDA graph, all captured at start (GPU only)


@dataclass
class _Stream:
    row: int                        # its row of the codec's states
    next_frame: int                 # where its next chunk must start
    used: float                     # time.monotonic() of its last chunk


@dataclass
class _Chunk:
    request: int                    # index in the Triton batch
    stream: str
    start: int                      # the stream's frame index of codes[0]
    codes: np.ndarray               # [T, N]
    keep: bool                      # False: a clone's reference frames, decoded for the state only


@register("qwen3_tts_codec")
class Qwen3TTSCodecStep(Step):
    inputs = (
        TensorSpec("codes", "TYPE_INT32", (-1,), ragged=True),
        TensorSpec("stream_id", "TYPE_STRING", (1,)),
        TensorSpec("first_frame", "TYPE_INT32", (1,)),
        TensorSpec("finish_reason", "TYPE_STRING", (1,)),
        SPEECH,
    )
    outputs = AUDIO_CHUNK_OUTPUTS
    Params = Qwen3TTSCodecParams

    def __init__(self, ctx: StepContext):
        super().__init__(ctx)
        p = self.params
        if p.decode_batch < 1 or p.max_streams < 1 or p.stream_idle_s <= 0:
            raise ValueError("decode_batch and max_streams must be >= 1, stream_idle_s > 0")
        if p.pad_rows not in ("fixed", "pow2"):
            raise ValueError(f"pad_rows must be 'fixed' or 'pow2', got {p.pad_rows!r}")
        bit_stable_on_cpu(ctx.device, p.pad_rows)
        self.codec = load_codec(speech_folder(ctx, p.codec_checkpoint, p.checkpoint), ctx.device, torch_dtype(p.dtype))
        self.sample_rate, self.n = self.codec.sample_rate, self.codec.num_quantizers
        self.codebook_size = self.codec.decoder.config["codebook_size"]
        self.plan = ChunkPlan(p.first_chunk_frames, p.chunk_frames, 0, 0)
        sizes = [p.decode_batch] if p.pad_rows == "fixed" else [1 << i for i in range(p.decode_batch.bit_length())]
        graphs = p.cuda_graphs and self.codec.decoder.pre_conv.conv.weight.is_cuda
        self.pool = StatePool(StreamingDecoder(self.codec.decoder), p.max_streams,  # row r: the stream holding r
                              tuple(sizes) if graphs else (), max(p.first_chunk_frames, p.chunk_frames))
        if graphs:
            self.pool.capture()
        self.free = list(range(p.max_streams - 1, -1, -1))
        self.streams: dict[str, _Stream] = {}

    def input_limits(self) -> dict:
        return {"codes": (self.params.max_model_len * self.n,)}     # a non-streamed reply's frames, all at once

    def execute(self, requests: list[Request]) -> list[dict | BaseException]:
        now = time.monotonic()
        self.drop_idle(now)
        results: list[dict | BaseException | None] = [None] * len(requests)
        queues: dict[str, list[_Chunk]] = {}                   # per stream, its chunks in order
        ended: list[str] = []                                  # streams whose last response is here
        for i, req in enumerate(requests):
            try:
                for chunk in self.chunks(i, req):
                    queues.setdefault(chunk.stream, []).append(chunk)
                if req.string("finish_reason"):
                    ended.append(req.string("stream_id"))
            except Exception as exc:  # noqa: BLE001 - this request fails, its neighbours go on
                results[i] = exc
        audio: dict[int, list[np.ndarray]] = {i: [] for i in range(len(requests))}
        while queues:                           # a round: the next chunk of every stream
            ready = []
            for stream, queue in list(queues.items()):
                chunk = queue.pop(0)
                if not queue:
                    del queues[stream]
                if results[chunk.request] is not None:
                    continue
                try:
                    self.claim(chunk, now)
                    ready.append(chunk)
                except Exception as exc:  # noqa: BLE001
                    results[chunk.request] = exc
                    self.drop(stream)           # its later chunks fail too, clearly
            for length in sorted({len(c.codes) for c in ready}):
                group = [c for c in ready if len(c.codes) == length]
                try:
                    waves = self.decode(group)
                except Exception as exc:  # noqa: BLE001 - the streams of a failed call end
                    for c in group:
                        results[c.request] = exc
                        self.drop(c.stream)
                    continue
                for c, wave in zip(group, waves):
                    self.streams[c.stream].next_frame += length
                    self.streams[c.stream].used = now
                    if c.keep:
                        audio[c.request].append(wave)
        for stream in ended:
            self.drop(stream)
        for i, req in enumerate(requests):
            if results[i] is None:
                results[i] = {"waveform": np.concatenate(audio[i]) if audio[i] else np.zeros(0, np.float32),
                              "sample_rate": np.asarray([self.sample_rate], dtype=np.int32),
                              "finish_reason": req.get("finish_reason"),
                              "speech": req.get("speech")}
        return results

    def chunks(self, index: int, req: Request) -> list[_Chunk]:
        """A response's chunks, in order: a clone's reference frames (first response only), then the
        plan's chunks of its new frames."""
        most = self.params.max_model_len
        stream, first = req.string("stream_id") or "", int_scalar(req, "first_frame", -most, most)
        if not stream or len(stream) > MAX_STREAM_ID:
            raise InvalidInput("stream_id", f"expected 1 to {MAX_STREAM_ID} characters, got {len(stream)}")
        reason = req.string("finish_reason") or ""
        if reason == "cancelled":
            return []
        codes = req.get("codes")
        codes = codes.cpu().numpy() if hasattr(codes, "cpu") else np.asarray(codes)
        codes = codes.reshape(whole("codes", codes.size, self.n), self.n)
        start, end = max(first, 0), first + len(codes)         # the new frames (after a clone's reference)
        if end > most:
            raise InvalidInput("first_frame", f"the frames [{first}, {end}) pass the context's {most}")
        spans = self.plan.chunks(start, end, final=bool(reason)) if end > start else []
        covered = (spans[0][0], spans[-1][1]) if spans else (start, start)
        if covered != (start, end):
            raise InvalidInput("codes", f"stream {stream}: frames [{start}, {end}) are not whole chunks of the "
                                        "codec's plan (talker and codec disagree on first_chunk_frames / chunk_frames?)")
        out = [_Chunk(index, stream, first, codes[:start - first], keep=False)] if spans and first < 0 else []
        return out + [_Chunk(index, stream, a, codes[a - first:b - first], keep=True) for a, b in spans]

    def claim(self, chunk: _Chunk, now: float) -> None:
        """Check that the chunk continues its stream's state; a stream's first chunk takes a free row."""
        s = self.streams.get(chunk.stream)
        if s is not None:
            if s.next_frame != chunk.start:
                raise RuntimeError(f"stream {chunk.stream}: a chunk from frame {chunk.start}, but its decoder "
                                   f"state is at frame {s.next_frame} (chunks out of order or repeated)")
            return
        if chunk.start > 0:
            raise RuntimeError(f"stream {chunk.stream}: no decoder state for its chunk from frame {chunk.start}: "
                               f"the state was dropped (no chunk for over stream_idle_s = "
                               f"{self.params.stream_idle_s:g} s, or an earlier chunk failed) or never made")
        if not self.free:
            raise Unavailable(f"stream {chunk.stream} cannot start: all max_streams = {self.params.max_streams} "
                              "decoder states are in use by live streams; retry later")
        row = self.free.pop()
        self.pool.reset(row)
        self.streams[chunk.stream] = _Stream(row, chunk.start, now)

    def drop(self, stream: str) -> None:
        s = self.streams.pop(stream, None)
        if s is not None:
            self.free.append(s.row)

    def drop_idle(self, now: float) -> None:
        idle = [k for k, s in self.streams.items() if now - s.used > self.params.stream_idle_s]
        for k in idle:
            self.drop(k)
        if idle:
            self.ctx.log(f"{self.ctx.model_name}: dropped the decoder state of {len(idle)} stream(s) idle for "
                         f"over {self.params.stream_idle_s:g} s (cancelled?)")

    def decode(self, group: list[_Chunk]) -> list[np.ndarray]:
        """Same-length chunks of distinct streams -> their waveforms; the streams' states advance.
        `decode_batch` rows per call at most, padded (see pad_rows) with the pool's scratch row decoding
        the first chunk's codes."""
        n, out = self.params.decode_batch, []
        for i in range(0, len(group), n):
            part = group[i:i + n]
            size = n if self.params.pad_rows == "fixed" else min(n, 1 << (len(part) - 1).bit_length())
            pad = size - len(part)
            rows = [self.streams[c.stream].row for c in part] + [self.pool.scratch] * pad
            codes = torch.from_numpy(np.stack([c.codes for c in part + [part[0]] * pad]).astype(np.int64))
            codes = codes.clamp(0, self.codebook_size - 1).to(self.pool.device)  # ignore_eos may leave EOS in code 0
            out += list(self.pool.decode(rows, codes)[:len(part)].float().numpy())
        return out
