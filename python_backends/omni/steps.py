"""Qwen3-Omni's thinker, speech and text in, text out: its pre step (chat template with audio parts, the
audio decoded to 16 kHz, each placeholder expanded to its clip's token count, as Qwen3OmniMoeProcessor
does) and its audio tower step. The thinker itself is the shared AR step with spliced embeddings
(ar/embeds_step.py, models/qwen3_omni.py), the detokenizer the chat models' own.

    pre    messages (+ audios bytes) -> input_ids, sampling, reply_options, audio_samples (every clip, one
           after another), audio_lengths (samples per clip)
    audio  audio_samples + audio_lengths of every request of the batch -> prompt_embeds (packed forwards
           of at most max_batch_frames tower outputs, every request's clips side by side)
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from triton_omni.encoders.batching import forward_groups
from triton_omni.media.audio import decode
from triton_omni.omni.audio import MIN_SAMPLES, Qwen3OmniAudioEncoder, audio_tokens, request_layout, thinker_config
from triton_omni.omni.chat import AudioInputs, AudioPart, parse_audio_messages
from triton_omni.encoders.qwen3_audio import RATE, Qwen3AudioConfig, encoder_frames
from triton_omni.runtime.device import upload
from triton_omni.runtime.errors import InvalidInput
from triton_omni.runtime.params import torch_dtype
from triton_omni.runtime.spec import TensorSpec
from triton_omni.runtime.step import Request, Step, StepContext, register
from triton_omni.text.chat import ChatPreParams, ChatPreprocess

AUDIO_PAD = "<|audio_pad|>"
AUDIO_SAMPLES = TensorSpec("audio_samples", "TYPE_FP32", (-1,))
AUDIO_LENGTHS = TensorSpec("audio_lengths", "TYPE_INT64", (-1,))


@dataclass
class AudioLimits:
    """What one request may hand the audio path; every step of it refuses more."""
    max_audios: int = 8
    max_audio_seconds: float = 600.0      # one clip at most


@dataclass
class Qwen3OmniPreParams(ChatPreParams, AudioLimits):
    max_upload_bytes: int = 32 << 20       # one clip's encoded bytes at most
    max_messages_bytes: int = 64 << 20     # messages may carry audio as base64


@register("qwen3_omni_pre")
class Qwen3OmniPre(ChatPreprocess):
    inputs = ChatPreprocess.inputs + (
        TensorSpec("audios", "TYPE_STRING", (-1,), optional=True, ragged=True),     # encoded audio files, in order
    )
    outputs = ChatPreprocess.outputs + (AUDIO_SAMPLES, AUDIO_LENGTHS)
    Params = Qwen3OmniPreParams

    def __init__(self, ctx: StepContext):
        super().__init__(ctx)
        thinker = thinker_config(ctx.checkpoint(self.params.checkpoint))
        self.audio_config = Qwen3AudioConfig.from_dict(thinker.get("audio_config") or {})
        self.audio_token_id = int(thinker["audio_token_id"])

    def input_limits(self) -> dict:
        return {**super().input_limits(), "audios": (self.params.max_audios,)}

    def prompt_text(self, req: Request, tools) -> str | list[int]:
        """The chat step's prompt, with each clip decoded here (its length sizes its placeholder) and the
        expanded text returned; the clips wait on the request (`req.clips`) for `execute`."""
        req.clips = []
        if req.get("messages") is None:          # a raw prompt: placeholders in it would have no audio
            if req.get("audios") is not None:
                raise InvalidInput("audios", "audio needs messages with audio content parts")
            prompt = super().prompt_text(req, tools)
            if (AUDIO_PAD in prompt) if isinstance(prompt, str) else (self.audio_token_id in prompt):
                raise InvalidInput("text_input" if isinstance(prompt, str) else "prompt_token_ids",
                                   "audio placeholders need messages with audio content parts")
            return prompt
        self.check_messages_only(req)
        messages, parts = parse_audio_messages(req.json("messages"), AudioInputs(req.get("audios")))
        if len(parts) > self.params.max_audios:
            raise InvalidInput("messages", f"{len(parts)} audio clips; this model takes at most {self.params.max_audios}")
        text = self.render_chat(messages, req, tools)
        req.clips = [self.clip(p) for p in parts]
        pieces = text.split(AUDIO_PAD)
        if len(pieces) != len(req.clips) + 1:
            raise InvalidInput("messages", f"the prompt has {len(pieces) - 1} audio placeholders for "
                                           f"{len(req.clips)} audio parts (is '{AUDIO_PAD}' in the text?)")
        counts = audio_tokens([c.size for c in req.clips], self.audio_config)
        return pieces[0] + "".join(AUDIO_PAD * n + piece for n, piece in zip(counts, pieces[1:]))

    def clip(self, part: AudioPart) -> np.ndarray:
        """A part's audio, decoded (any container media/audio.py reads) to 16 kHz mono float32."""
        p = self.params
        if len(part.data) > p.max_upload_bytes:
            raise InvalidInput(part.field, f"{len(part.data)} bytes; at most {p.max_upload_bytes} are accepted")
        try:
            wave, _ = decode(part.data, RATE, max_seconds=p.max_audio_seconds)
        except ValueError as e:
            raise InvalidInput(part.field, str(e)) from None
        if wave.size < MIN_SAMPLES:
            raise InvalidInput(part.field, f"{wave.size / RATE:.3f} s of audio; at least {MIN_SAMPLES / RATE:.3f} s "
                                           "are needed")
        if not np.isfinite(wave).all():
            raise InvalidInput(part.field, "has samples that are not finite numbers")
        return wave

    def execute(self, requests: list[Request]) -> list[dict | BaseException]:
        """The chat step's outputs, plus each request's clips."""
        results = super().execute(requests)
        for req, out in zip(requests, results):
            if isinstance(out, dict):
                clips = getattr(req, "clips", [])
                out["audio_samples"] = np.concatenate(clips) if clips else np.zeros(0, np.float32)
                out["audio_lengths"] = np.asarray([c.size for c in clips], dtype=np.int64)
        return results


@dataclass
class Qwen3OmniAudioParams(AudioLimits):
    checkpoint: str = ""
    dtype: str = "float32"
    max_batch_frames: int = 16384        # tower outputs (80 ms each) of one forward: bounds activations


def host(value) -> np.ndarray:
    """An input as numpy (a GPU step may be handed a torch tensor on the device)."""
    return value.cpu().numpy() if hasattr(value, "cpu") else np.asarray(value)


@register("qwen3_omni_audio")
class Qwen3OmniAudioStep(Step):
    """Every clip of every request in the batch through the audio tower, in packed forwards."""
    inputs = (TensorSpec("audio_samples", "TYPE_FP32", (-1,), ragged=True),
              TensorSpec("audio_lengths", "TYPE_INT64", (-1,), ragged=True))
    outputs = (TensorSpec("prompt_embeds", "TYPE_FP32", (-1, -1)),)
    Params = Qwen3OmniAudioParams

    def __init__(self, ctx: StepContext):
        super().__init__(ctx)
        self.model = Qwen3OmniAudioEncoder.load(ctx.checkpoint(self.params.checkpoint), ctx.device,
                                                torch_dtype(self.params.dtype))
        self.device = torch.device(ctx.device)

    def input_limits(self) -> dict:
        p = self.params
        return {"audio_samples": (int(p.max_audios * p.max_audio_seconds * RATE),), "audio_lengths": (p.max_audios,)}

    def warmup_inputs(self, spec) -> list[dict]:
        """A 1 s clip (the tower's first call sets up its kernels)."""
        return [{"audio_samples": np.zeros(RATE, np.float32), "audio_lengths": np.asarray([RATE], np.int64)}]

    def job(self, req: Request) -> list[np.ndarray]:
        samples = host(req.get("audio_samples")).astype(np.float32, copy=False).reshape(-1)
        lengths = host(req.get("audio_lengths")).astype(np.int64).reshape(-1)
        most = int(self.params.max_audio_seconds * RATE)
        if int(lengths.sum()) != samples.size:
            raise InvalidInput("audio_lengths", f"add up to {int(lengths.sum())}; audio_samples has {samples.size}")
        if lengths.size and (lengths.min() < MIN_SAMPLES or lengths.max() > most):
            raise InvalidInput("audio_lengths", f"each clip has {MIN_SAMPLES} to {most} samples")
        if not np.isfinite(samples).all():
            raise InvalidInput("audio_samples", "has values that are not finite numbers")
        bounds = np.cumsum([0, *lengths.tolist()])
        return [samples[a:b] for a, b in zip(bounds[:-1], bounds[1:])]

    def execute(self, requests: list[Request]):
        return self.execute_jobs(requests, self.run)

    @torch.inference_mode()
    def run(self, requests: list[Request], jobs: list[list[np.ndarray]]):
        clips = [c for job in jobs for c in job]
        # each request's clips as the processor sees them together (padded to its longest); requests apart
        layouts = [c for job in jobs for c in request_layout([x.size for x in job], self.model.config)]
        sizes = [encoder_frames(c.frames, self.model.config) for c in layouts]
        rows: list[torch.Tensor] = [None] * len(clips)          # type: ignore[list-item]
        for group in forward_groups(sizes, self.params.max_batch_frames):
            flat = upload(np.concatenate([clips[i] for i in group]), self.device, torch.float32)
            embeds, counts = self.model(list(flat.split([clips[i].size for i in group])), [layouts[i] for i in group])
            for i, part in zip(group, embeds.float().split(counts)):
                rows[i] = part
        at, width = 0, self.model.config.output_dim
        for job in jobs:
            mine = rows[at:at + len(job)]
            at += len(job)
            out = torch.cat(mine) if mine else torch.zeros((0, width), device=self.device)
            yield {"prompt_embeds": out.contiguous() if out.is_cuda else out.numpy()}
