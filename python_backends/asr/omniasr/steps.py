"""Omnilingual ASR CTC's encoder step: every clip of every request in the batch through the packed
encoder (model.py) in forwards of at most `max_batch_frames` frames, then each frame's best token and
its log-probability (greedy CTC: collapsing and detokenizing happen in ctc_post).

Pipeline: asr_pre (decode, segment) -> omniasr_ctc_encoder -> ctc_post (tokens, times, text).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from triton_omni.asr.features import normalize_clips
from triton_omni.asr.omniasr.model import OmniASRCTC, PackedClips
from triton_omni.asr.packing import clips_of, forward_groups
from triton_omni.asr.post import FRAME_IDS, FRAME_LOGPROBS, FRAME_STRIDE, SEGMENT_FRAMES
from triton_omni.asr.pre import SAMPLES, SEGMENT_SPANS
from triton_omni.asr.request import RATE
from triton_omni.runtime.device import upload
from triton_omni.runtime.params import torch_dtype
from triton_omni.runtime.spec import TensorSpec
from triton_omni.runtime.step import Request, Step, StepContext, register


@dataclass
class OmniASRCTCEncoderParams:
    checkpoint: str = ""
    dtype: str = "float32"
    max_segment_seconds: float = 40.0    # the model's input limit (Omnilingual ASR: 40 s)
    max_batch_frames: int = 16384        # frames of one forward (20 ms each): bounds activation memory
    max_audio_seconds: float = 3600.0    # of one request, as its pre step's (bounds the inputs)
    compile: bool = False                # torch.compile each layer's projections and feed-forward (GPU)


@register("omniasr_ctc_encoder")
class OmniASRCTCEncoder(Step):
    inputs = (TensorSpec("samples", "TYPE_FP32", (-1,), ragged=True),
              TensorSpec("segment_spans", "TYPE_INT64", (-1, 4), ragged=True))
    outputs = (FRAME_IDS, FRAME_LOGPROBS, SEGMENT_FRAMES, FRAME_STRIDE)
    Params = OmniASRCTCEncoderParams

    def __init__(self, ctx: StepContext):
        super().__init__(ctx)
        self.model = OmniASRCTC.load(ctx.checkpoint(self.params.checkpoint), ctx.device, torch_dtype(self.params.dtype))
        self.audio = self.model.config.audio
        self.device = torch.device(ctx.device)
        if self.params.compile:
            self.model.encoder.compile_layers()

    def input_limits(self) -> dict:
        most = int(self.params.max_audio_seconds * RATE * 2)      # overlapping windows repeat some samples
        return {SAMPLES.name: (most,), SEGMENT_SPANS.name: (int(self.params.max_audio_seconds * 10), None)}

    def job(self, req: Request) -> list[np.ndarray]:
        return clips_of(req, self.audio.min_samples(), int(self.params.max_segment_seconds * RATE))

    def execute(self, requests: list[Request]):
        return self.execute_jobs(requests, self.run)

    @torch.inference_mode()
    def run(self, requests: list[Request], jobs: list[list[np.ndarray]]):
        clips = [c for job in jobs for c in job]
        best: list[tuple[np.ndarray, np.ndarray]] = [None] * len(clips)       # type: ignore[list-item]
        frames = [self.audio.frames(c.size) for c in clips]
        for group in forward_groups(frames, self.params.max_batch_frames):
            best_ids, best_lp = self.forward([clips[i] for i in group])
            for i, ids, lp in zip(group, best_ids.split([frames[i] for i in group]), best_lp.split([frames[i] for i in group])):
                best[i] = (ids.numpy(), lp.numpy())
        stride = np.asarray([self.audio.stride], dtype=np.int32)
        at = 0
        for job in jobs:
            mine = best[at:at + len(job)]
            at += len(job)
            yield {"frame_ids": np.concatenate([m[0] for m in mine]).astype(np.int32) if mine else np.zeros(0, np.int32),
                   "frame_logprobs": np.concatenate([m[1] for m in mine]).astype(np.float32) if mine else np.zeros(0, np.float32),
                   "segment_frames": np.asarray([m[0].size for m in mine], dtype=np.int32),
                   "frame_stride": stride}

    def forward(self, clips: list[np.ndarray]) -> tuple[torch.Tensor, torch.Tensor]:
        """Clips (16 kHz) -> each frame's best token (argmax, as transformers' generate) and its
        log-probability, on the host. One upload of every clip's samples."""
        flat = upload(np.concatenate(clips), self.device, torch.float32)
        on_device = list(flat.split([c.size for c in clips]))
        dtype = next(self.model.parameters()).dtype
        normed = [c.to(dtype) for c in normalize_clips(on_device)]
        logits = self.model(PackedClips.build(normed, self.audio))
        ids = logits.argmax(dim=-1)
        # the best token's log-softmax alone, in the logits' dtype: no float32 copy of every frame's logits
        lp = (logits.gather(1, ids[:, None])[:, 0] - torch.logsumexp(logits, dim=-1)).float()
        return ids.cpu(), lp.cpu()
