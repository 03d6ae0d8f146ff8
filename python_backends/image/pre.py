"""The first step of an image model (CPU): check the request, fill in defaults, tokenize.

It outputs the request's settings as typed tensors (size in pixels, steps, guidance, seed, n,
format) for the GPU steps, and the prompt (and, when the request uses classifier-free guidance,
the negative prompt) tokenized exactly as the diffusers pipeline does: the chat template, then
padding to `max_sequence_length`. Which guidance values switch the negative branch on is the
model's rule (`uses_cfg`), so no later step encodes or denoises a branch that is never used.
Each model family registers its own subclass (z_image, flux2); the edit models and BAGEL write their
own pre steps on the request tensors defined here.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from triton_omni.diffusion.checkpoint import load_tokenizer, pipeline_folder, vae_scale_factor
from triton_omni.image import warmup as image_warmup
from triton_omni.image.request import ImageLimits, ImageRequest, parse_request
from triton_omni.runtime.spec import TensorSpec
from triton_omni.runtime.step import Request, Step, StepContext, string_array

def settings_tensors(r: ImageRequest, width: int | None = None, height: int | None = None) -> dict:
    """The request's settings as the typed tensors every later step reads (`width`/`height`: the
    output size when the model, not the request, decides it)."""
    return {"width": np.array([width or r.width], np.int32), "height": np.array([height or r.height], np.int32),
            "num_inference_steps": np.array([r.num_inference_steps], np.int32),
            "guidance_scale": np.array([r.guidance_scale], np.float32),
            "seed": np.array([r.seed], np.int64), "n": np.array([r.n], np.int32),
            "output_format": string_array(r.output_format)}


REQUEST_INPUTS = (
    TensorSpec("prompt", "TYPE_STRING", (1,)),
    TensorSpec("negative_prompt", "TYPE_STRING", (1,), optional=True),
    TensorSpec("size", "TYPE_STRING", (1,), optional=True),
    TensorSpec("num_inference_steps", "TYPE_INT32", (1,), optional=True),
    TensorSpec("guidance_scale", "TYPE_FP32", (1,), optional=True),
    TensorSpec("seed", "TYPE_INT64", (1,), optional=True),
    TensorSpec("n", "TYPE_INT32", (1,), optional=True),
    TensorSpec("output_format", "TYPE_STRING", (1,), optional=True),
)

# What the GPU steps read: settings with defaults filled in (same names as the request fields,
# so the ensemble wires the checked values, never the raw ones).
SETTINGS = (
    TensorSpec("width", "TYPE_INT32", (1,)),
    TensorSpec("height", "TYPE_INT32", (1,)),
    TensorSpec("num_inference_steps", "TYPE_INT32", (1,)),
    TensorSpec("guidance_scale", "TYPE_FP32", (1,)),
    TensorSpec("seed", "TYPE_INT64", (1,)),
    TensorSpec("n", "TYPE_INT32", (1,)),
    TensorSpec("output_format", "TYPE_STRING", (1,)),
)


@dataclass
class ImagePreParams(ImageLimits):
    checkpoint: str = ""
    max_sequence_length: int = 512


class ImagePre(Step):
    inputs = REQUEST_INPUTS
    outputs = (
        TensorSpec("text_ids", "TYPE_INT32", (-1, -1)),    # [1 or 2, max_sequence_length]: prompt, negative
        TensorSpec("text_mask", "TYPE_INT32", (-1, -1)),
        *SETTINGS,
    )
    Params = ImagePreParams
    enable_thinking: ClassVar[bool] = False      # the chat-template flag the model's pipeline passes

    def __init__(self, ctx: StepContext):
        super().__init__(ctx)
        self.folder = pipeline_folder(ctx, self.params.checkpoint)
        self.tokenizer = load_tokenizer(self.folder)
        self.multiple = vae_scale_factor(self.folder) * 2     # VAE factor x the 2x2 latent patches
        self.limits = ImageLimits(**{f.name: getattr(self.params, f.name) for f in dataclasses.fields(ImageLimits)})

    def uses_cfg(self, guidance_scale: float) -> bool:
        raise NotImplementedError

    def warmup_inputs(self, spec) -> list[dict]:
        return image_warmup.pre_samples(spec, self.params.default_size)

    def tokenize(self, texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
        templated = [self.tokenizer.apply_chat_template([{"role": "user", "content": t}], tokenize=False,
                                                        add_generation_prompt=True,
                                                        enable_thinking=self.enable_thinking) for t in texts]
        enc = self.tokenizer(templated, padding="max_length", max_length=self.params.max_sequence_length,
                             truncation=True, return_tensors="np")
        return enc["input_ids"].astype(np.int32), enc["attention_mask"].astype(np.int32)

    def one(self, req: Request) -> dict:
        r: ImageRequest = parse_request(req, self.multiple, self.limits)
        ids, mask = self.tokenize([r.prompt, r.negative_prompt] if self.uses_cfg(r.guidance_scale) else [r.prompt])
        return {"text_ids": ids, "text_mask": mask, **settings_tensors(r)}
