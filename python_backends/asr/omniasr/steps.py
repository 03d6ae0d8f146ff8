"""Omnilingual ASR's steps. The CTC models' encoder step: every clip of every request in the batch
through the packed encoder (model.py) in forwards of at most `max_batch_frames` frames, then each frame's best token and
its log-probability (greedy CTC: collapsing and detokenizing happen in ctc_post).

Pipeline: asr_pre (decode, segment) -> omniasr_ctc_encoder -> ctc_post (tokens, times, text).
"""
from __future__ import annotations

import json
from dataclasses import dataclass

import numpy as np
import torch

from triton_omni.asr.features import normalize_clips
from triton_omni.asr.llm_pre import LLMASRPre, PromptParts
from triton_omni.asr.llm_tensors import PROMPT_EMBEDS
from triton_omni.asr.omniasr.model import AudioEncoderConfig, OmniASRCTC, OmniASRLLMEncoder, PackedClips
from triton_omni.asr.packing import clips_of, forward_groups
from triton_omni.asr.post import FRAME_IDS, FRAME_LOGPROBS, FRAME_STRIDE, SEGMENT_FRAMES
from triton_omni.asr.pre import SAMPLES, SEGMENT_SPANS
from triton_omni.asr.request import RATE, Options
from triton_omni.runtime.device import upload
from triton_omni.runtime.errors import InvalidInput
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


# -- Omnilingual ASR's LLM variant --------------------------------------------------------------------
# Pipeline: omniasr_llm_pre (decode, segments, prompts) -> omniasr_llm_encoder (every segment of every
# request in one packed forward, projected: the prompts' audio embeddings) -> asr_decode (the Llama
# decoder on the AR engine, one sequence per segment) -> asr_llm_post.


@register("omniasr_llm_pre")
class OmniASRLLMPre(LLMASRPre):
    """The prompt as `OmniASRProcessor.apply_transcription_request` writes it: the checkpoint's chat template
    over one user turn of [the audio, the language (a `<|lang:code|>` token) when given], then the BOS the
    transcript is decoded from. Without a language the model runs in its language-agnostic mode."""

    def __init__(self, ctx: StepContext):
        super().__init__(ctx)
        folder = ctx.checkpoint(self.params.checkpoint)
        raw = json.loads((folder / "config.json").read_text(encoding="utf-8"))
        self.audio = AudioEncoderConfig.from_dict(raw.get("audio_config") or {})
        self.audio_token_id = int(raw["audio_token_id"])
        vocab = self.tokenizer.get_vocab()
        self.languages = sorted(t[len("<|lang:"):-2] for t in vocab if t.startswith("<|lang:") and t.endswith("|>"))

    def audio_tokens(self, samples: int) -> int:
        return self.audio.frames(samples)

    def language(self, given: str) -> str:
        """A language code as the processor resolves it: lower case, an ISO 639-1 code mapped
        ("en" -> "eng_latn"), and a token for it in the vocabulary."""
        from transformers.models.omniasr.processing_omniasr import ISO_639_1_TO_LANGUAGE

        code = given.lower().replace("-", "_")
        code = ISO_639_1_TO_LANGUAGE.get(code, code)
        if code not in self.languages:
            raise InvalidInput("language", f"{given!r} is not a language of this checkpoint ({len(self.languages)} "
                                           f"codes such as {', '.join(self.languages[:5])}; or leave it out)")
        return code

    def prompt_parts(self, options: Options) -> PromptParts:
        content = [{"type": "audio"}]
        if options.language:
            content.append({"type": "language", "language": self.language(options.language)})
        ids = self.tokenizer.apply_chat_template([{"role": "user", "content": content}], tokenize=True,
                                                 add_generation_prompt=True, return_dict=False)
        return self.split(list(ids), self.audio_token_id)


@dataclass
class OmniASRLLMEncoderParams:
    checkpoint: str = ""
    dtype: str = "float32"
    max_segment_seconds: float = 40.0    # the model's input limit (Omnilingual ASR: 40 s)
    max_batch_frames: int = 16384        # frames of one forward (20 ms each): bounds activation memory
    max_audio_seconds: float = 3600.0


@register("omniasr_llm_encoder")
class OmniASRLLMEncoderStep(Step):
    inputs = OmniASRCTCEncoder.inputs
    outputs = (PROMPT_EMBEDS,)
    Params = OmniASRLLMEncoderParams

    def __init__(self, ctx: StepContext):
        super().__init__(ctx)
        self.model = OmniASRLLMEncoder.load(ctx.checkpoint(self.params.checkpoint), ctx.device,
                                            torch_dtype(self.params.dtype))
        self.audio = self.model.audio
        self.device = torch.device(ctx.device)

    input_limits = OmniASRCTCEncoder.input_limits

    def job(self, req: Request) -> list[np.ndarray]:
        return clips_of(req, self.audio.min_samples(), int(self.params.max_segment_seconds * RATE))

    def execute(self, requests: list[Request]):
        return self.execute_jobs(requests, self.run)

    @torch.inference_mode()
    def run(self, requests: list[Request], jobs: list[list[np.ndarray]]):
        clips = [c for job in jobs for c in job]
        frames = [self.audio.frames(c.size) for c in clips]
        rows: list[torch.Tensor] = [None] * len(clips)          # type: ignore[list-item]
        dtype = next(self.model.parameters()).dtype
        for group in forward_groups(frames, self.params.max_batch_frames):
            flat = upload(np.concatenate([clips[i] for i in group]), self.device, torch.float32)
            normed = [c.to(dtype) for c in normalize_clips(list(flat.split([clips[i].size for i in group])))]
            out = self.model(PackedClips.build(normed, self.audio)).float()
            for i, part in zip(group, out.split([frames[i] for i in group])):
                rows[i] = part
        at = 0
        for job in jobs:
            mine = rows[at:at + len(job)]
            at += len(job)
            out = torch.cat(mine) if mine else torch.zeros((0, self.model.multi_modal_projector.out_features), device=self.device)
            yield {"prompt_embeds": out.contiguous() if out.is_cuda else out.numpy()}
