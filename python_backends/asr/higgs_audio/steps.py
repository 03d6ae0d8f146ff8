"""Higgs Audio understanding's steps: its pre step (each segment's prompt as boson-multimodal's
`prepare_chatml_sample` writes a user turn of [instruction, audio] and the open assistant turn after it)
and its packed audio tower step.

Pipeline: higgs_audio_pre (decode, segments, prompts) -> higgs_audio_encoder (every segment of every
request in one packed tower call) -> asr_decode (the Llama decoder on the AR engine, one sequence per
segment) -> asr_llm_post.

The instruction is the request's `prompt`, else `transcribe_prompt`; with `task` "translate" (the
translation route) it is `translate_prompt`: the model is an audio LLM that follows its instruction,
which is how it translates. A given `language` is passed on as the transcript's language (the
instruction says nothing of it).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from triton_omni.asr.higgs_audio.model import HiggsAudioEncoder, HiggsAudioEncoderConfig, audio_tokens
from triton_omni.asr.llm_pre import LLMASRPre, LLMASRPreParams, PromptParts
from triton_omni.asr.llm_tensors import PROMPT_EMBEDS
from triton_omni.asr.packing import clips_of, forward_groups
from triton_omni.asr.pre import SAMPLES, SEGMENT_SPANS
from triton_omni.asr.request import INPUTS, RATE, Options
from triton_omni.runtime.device import upload
from triton_omni.runtime.errors import InvalidInput
from triton_omni.runtime.params import torch_dtype
from triton_omni.runtime.spec import TensorSpec
from triton_omni.runtime.step import Request, Step, StepContext, register

TASK = TensorSpec("task", "TYPE_STRING", (1,), optional=True)     # transcribe (default) or translate


@dataclass
class HiggsAudioPreParams(LLMASRPreParams):
    transcribe_prompt: str = "What words do you hear from the provided audio? Write it down for me."
    translate_prompt: str = "Translate the speech in the provided audio into English. Write down only the translation."
    translate: bool = True


@register("higgs_audio_pre")
class HiggsAudioPre(LLMASRPre):
    inputs = INPUTS + (TASK,)
    Params = HiggsAudioPreParams

    def __init__(self, ctx: StepContext):
        super().__init__(ctx)
        import json

        raw = json.loads((ctx.checkpoint(self.params.checkpoint) / "config.json").read_text(encoding="utf-8"))
        HiggsAudioEncoderConfig.from_folder(ctx.checkpoint(self.params.checkpoint))      # refuses a tower-less one
        self.audio_token_id = int(raw["audio_in_token_idx"])

    def audio_tokens(self, samples: int) -> int:
        return audio_tokens(samples)

    def prompt_parts(self, options: Options) -> PromptParts:
        p = self.params
        instruction = options.prompt.strip() or (p.translate_prompt if options.task == "translate" else p.transcribe_prompt)
        encode = lambda text: self.tokenizer.encode(text, add_special_tokens=False)     # noqa: E731
        # the turns as prepare_chatml_sample tokenizes them: header, each content part, end of turn
        ids = (encode("<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\n") + encode(instruction)
               + encode("<|audio_bos|><|AUDIO|><|audio_eos|>") + encode("<|eot_id|>")
               + encode("<|start_header_id|>assistant<|end_header_id|>\n\n"))
        return self.split(ids, self.audio_token_id)


@dataclass
class HiggsAudioEncoderParams:
    checkpoint: str = ""
    dtype: str = "float32"
    max_segment_seconds: float = 30.0      # the Whisper tower's input at most
    max_batch_frames: int = 16384          # tower frames (20 ms each) of one forward: bounds activations
    max_audio_seconds: float = 3600.0


@register("higgs_audio_encoder")
class HiggsAudioEncoderStep(Step):
    inputs = (TensorSpec("samples", "TYPE_FP32", (-1,), ragged=True),
              TensorSpec("segment_spans", "TYPE_INT64", (-1, 4), ragged=True))
    outputs = (PROMPT_EMBEDS,)
    Params = HiggsAudioEncoderParams

    def __init__(self, ctx: StepContext):
        super().__init__(ctx)
        self.model = HiggsAudioEncoder.load(ctx.checkpoint(self.params.checkpoint), ctx.device,
                                            torch_dtype(self.params.dtype))
        self.device = torch.device(ctx.device)

    def input_limits(self) -> dict:
        most = int(self.params.max_audio_seconds * RATE * 2)
        return {SAMPLES.name: (most,), SEGMENT_SPANS.name: (int(self.params.max_audio_seconds * 10), None)}

    def job(self, req: Request) -> list[np.ndarray]:
        return clips_of(req, 800, int(min(self.params.max_segment_seconds, 30.0) * RATE))

    def execute(self, requests: list[Request]):
        return self.execute_jobs(requests, self.run)

    @torch.inference_mode()
    def run(self, requests: list[Request], jobs: list[list[np.ndarray]]):
        clips = [c for job in jobs for c in job]
        sizes = [2 * audio_tokens(c.size) for c in clips]
        rows: list[torch.Tensor] = [None] * len(clips)          # type: ignore[list-item]
        for group in forward_groups(sizes, self.params.max_batch_frames):
            flat = upload(np.concatenate([clips[i] for i in group]), self.device, torch.float32)
            embeds, counts = self.model(list(flat.split([clips[i].size for i in group])))
            for i, part in zip(group, embeds.float().split(counts)):
                rows[i] = part
        at = 0
        width = self.model.config.text_hidden
        for job in jobs:
            mine = rows[at:at + len(job)]
            at += len(job)
            out = torch.cat(mine) if mine else torch.zeros((0, width), device=self.device)
            yield {"prompt_embeds": out.contiguous() if out.is_cuda else out.numpy()}
