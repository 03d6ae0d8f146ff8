"""Qwen3-ASR's steps: its pre step (the prompt of each segment, as `Qwen3ASRProcessor.
apply_transcription_request` writes it) and its packed audio encoder step.

Pipeline: qwen3_asr_pre (decode, segments, prompts) -> qwen3_asr_encoder (every segment of every request
in one packed forward: the prompts' audio embeddings) -> asr_decode (the Qwen3 decoder on the AR
engine, one sequence per segment) -> asr_llm_post (text deltas; the transcript, language, segments).

The prompt: the checkpoint's chat template over [system: the request's `prompt` (context, hot
words), if any; user: the audio; assistant: "language <Name><asr_text>" when `language` is given,
else empty], the assistant turn left open. Without a language the model writes "language <Name>
<asr_text>" first: that header is its detected language (asr_decode keeps it out of the text).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from triton_omni.asr.llm_post import LLMASRPost, most_common
from triton_omni.asr.llm_pre import LLMASRPre, PromptParts
from triton_omni.asr.llm_tensors import PROMPT_EMBEDS
from triton_omni.asr.packing import clips_of, forward_groups
from triton_omni.asr.pre import SAMPLES, SEGMENT_SPANS
from triton_omni.asr.qwen3_asr.model import Qwen3ASRAudioEncoder, audio_tokens, encoder_frames
from triton_omni.asr.request import RATE, Options
from triton_omni.asr.features import whisper_frames
from triton_omni.runtime.device import upload
from triton_omni.runtime.errors import InvalidInput
from triton_omni.runtime.params import torch_dtype
from triton_omni.runtime.spec import TensorSpec
from triton_omni.runtime.step import Request, Step, StepContext, register

TEXT_MARKER = "<asr_text>"       # ends the model's "language <Name>" header


def language_names() -> dict[str, str]:
    """Language code -> the name Qwen3-ASR was trained with (transformers' table of the release's)."""
    from transformers.models.qwen3_asr.processing_qwen3_asr import LANGUAGE_CODE_TO_NAME

    return dict(LANGUAGE_CODE_TO_NAME)


def language_code(header: str) -> str:
    """The model's header ("language English") -> "en" ("" when it names none, or "None": silence)."""
    name = header.strip()
    name = name[len("language"):].strip() if name.lower().startswith("language") else name
    by_name = {v.lower(): k for k, v in language_names().items()}
    return by_name.get(name.lower(), "")


@register("qwen3_asr_pre")
class Qwen3ASRPre(LLMASRPre):
    def __init__(self, ctx: StepContext):
        super().__init__(ctx)
        import json

        folder = ctx.checkpoint(self.params.checkpoint)
        config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
        from triton_omni.asr.qwen3_asr.model import Qwen3ASREncoderConfig

        self.encoder_config = Qwen3ASREncoderConfig.from_dict(config.get("audio_config") or {})
        self.audio_token_id = int(config["audio_token_id"])
        self.names = language_names()

    def audio_tokens(self, samples: int) -> int:
        return audio_tokens(samples, self.encoder_config)

    def prompt_parts(self, options: Options) -> PromptParts:
        messages = []
        if options.prompt.strip():
            messages.append({"role": "system", "content": [{"type": "text", "text": options.prompt}]})
        messages.append({"role": "user", "content": [{"type": "audio"}]})
        prefill = ""
        if options.language:
            code = options.language.lower().replace("_", "-").split("-")[0]
            if code not in self.names:
                raise InvalidInput("language", f"{options.language!r} is not one Qwen3-ASR knows; known: "
                                               f"{', '.join(sorted(self.names))} (or leave it out: the model detects it)")
            prefill = f"language {self.names[code]}{TEXT_MARKER}"
        messages.append({"role": "assistant", "content": [{"type": "text", "text": prefill}]})
        ids = self.tokenizer.apply_chat_template(messages, tokenize=True, continue_final_message=True,
                                                 return_dict=False)
        return self.split(list(ids), self.audio_token_id)


@dataclass
class Qwen3ASREncoderParams:
    checkpoint: str = ""
    dtype: str = "float32"
    max_segment_seconds: float = 40.0      # a segment's length at most (the pre step cuts to 30 s)
    max_batch_frames: int = 16384          # encoder outputs (80 ms each) of one forward: bounds activations
    max_audio_seconds: float = 3600.0      # of one request, as its pre step's (bounds the inputs)


@register("qwen3_asr_encoder")
class Qwen3ASREncoderStep(Step):
    inputs = (TensorSpec("samples", "TYPE_FP32", (-1,), ragged=True),
              TensorSpec("segment_spans", "TYPE_INT64", (-1, 4), ragged=True))
    outputs = (PROMPT_EMBEDS,)
    Params = Qwen3ASREncoderParams

    def __init__(self, ctx: StepContext):
        super().__init__(ctx)
        self.model = Qwen3ASRAudioEncoder.load(ctx.checkpoint(self.params.checkpoint), ctx.device,
                                               torch_dtype(self.params.dtype))
        self.device = torch.device(ctx.device)

    def input_limits(self) -> dict:
        most = int(self.params.max_audio_seconds * RATE * 2)
        return {SAMPLES.name: (most,), SEGMENT_SPANS.name: (int(self.params.max_audio_seconds * 10), None)}

    def job(self, req: Request) -> list[np.ndarray]:
        return clips_of(req, 1, int(self.params.max_segment_seconds * RATE))

    def execute(self, requests: list[Request]):
        return self.execute_jobs(requests, self.run)

    @torch.inference_mode()
    def run(self, requests: list[Request], jobs: list[list[np.ndarray]]):
        clips = [c for job in jobs for c in job]
        sizes = [encoder_frames(whisper_frames(max(c.size, 8000)), self.model.config) for c in clips]
        rows: list[torch.Tensor] = [None] * len(clips)          # type: ignore[list-item]
        for group in forward_groups(sizes, self.params.max_batch_frames):
            flat = upload(np.concatenate([clips[i] for i in group]), self.device, torch.float32)
            embeds, counts = self.model(list(flat.split([clips[i].size for i in group])))
            for i, part in zip(group, embeds.float().split(counts)):
                rows[i] = part
        at = 0
        width = self.model.config.output_dim
        for job in jobs:
            mine = rows[at:at + len(job)]
            at += len(job)
            out = torch.cat(mine) if mine else torch.zeros((0, width), device=self.device)
            yield {"prompt_embeds": out.contiguous() if out.is_cuda else out.numpy()}


@register("qwen3_asr_post")
class Qwen3ASRPost(LLMASRPost):
    def language_of(self, headers: list[str]) -> str:
        """The language the model wrote in its segments' headers, the most frequent, as a code ("en")."""
        return most_common([language_code(h) for h in headers])
