"""Qwen-Image-Edit (route image_edit): the steps of diffusers' `QwenImageEditPipeline`, and of
`QwenImageEditPlusPipeline` (several input images) when model_index.json names that class.

pre           checks the request and decodes the input image(s) (Pillow). Each is resized (Lanczos, as
              the pipeline's VaeImageProcessor) to about `image_area` pixels at its own aspect ratio,
              sides multiples of 32 (`calculate_dimensions`); the output size defaults to the same for
              the (last) input image. Plus shows the text encoder a second, ~384x384 copy. The image
              processor's patches and the prompt template (image placeholders expanded to one token
              per merged patch, as Qwen2VLProcessor expands them) are made here, on the CPU.
vae_encode    AutoencoderKLQwenImage (a causal video VAE run on one frame): the distribution's mode,
              normalised by the per-channel latents_mean / latents_std, packed into 2x2 patches.
text_encoder  Qwen2.5-VL with the image in the prompt; the last hidden state at the real tokens, less
              the first `drop_tokens` (the system prompt: the pipeline's prompt_template_encode_start_idx).
denoise       QwenImageTransformer2DModel on [noise tokens | image tokens] (the image latents ride beside
              the noise; only the noise tokens' prediction is used). Sigmas linspace(1, 1/N, N) shifted by
              mu for the output's token count. True CFG when guidance > 1: neg + g (pos - neg), rescaled
              per token to the norm of the conditional prediction.
vae_decode    latents * std + mean (the pipeline's `/ (1 / std)`), decoded as one frame.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Hashable

import numpy as np
import torch

from triton_omni.image.checkpoint import load_component, model_index, pipeline_folder, vae_scale_factor
from triton_omni.image.denoise import DenoiseStep, Job
from triton_omni.image.edit import (CONDITION_INPUTS, IMAGE_PAD, VISION_TOKENS, EditDenoiseParams, EditModelParams,
                                    EditTextEncoder, EditTextEncoderParams, OneFrameVaeDecode, UploadLimits,
                                    condition_images, condition_limits, decode_inputs, host, latent_stats)
from triton_omni.image.pre import REQUEST_INPUTS, SETTINGS, settings_tensors
from triton_omni.image.request import ImageLimits, parse_request, parse_size
from triton_omni.image.tensors import group_by, to_output, to_torch
from triton_omni.runtime.errors import InvalidInput
from triton_omni.runtime.spec import TensorSpec
from triton_omni.runtime.step import Request, Step, StepContext, register

# The pipelines' prompt template (prompt_template_encode); Edit puts one image before the prompt,
# Plus one "Picture i: " slot per image.
TEMPLATE = ("<|im_start|>system\nDescribe the key features of the input image (color, shape, size, texture, objects, "
            "background), then explain how the user's text instruction should alter or modify the image. Generate a "
            "new image that meets the user's requirements while maintaining consistency with the original input where "
            "appropriate.<|im_end|>\n<|im_start|>user\n{}<|im_end|>\n<|im_start|>assistant\n")
VISION = "<|vision_start|>{}<|vision_end|>"
PLUS = "QwenImageEditPlusPipeline"


def is_plus(folder) -> bool:
    return model_index(folder).get("_class_name") == PLUS


def calculate_dimensions(area: int, ratio: float) -> tuple[int, int]:
    """The pipelines' `calculate_dimensions`: (width, height) of about `area` pixels, multiples of 32."""
    width = math.sqrt(area * ratio)
    return round(width / 32) * 32, round(width / ratio / 32) * 32


def pack(latents: torch.Tensor) -> torch.Tensor:
    """[B, C, h, w] -> [B, h/2 * w/2, 4C] (the pipeline's `_pack_latents`)."""
    b, c, h, w = latents.shape
    return latents.view(b, c, h // 2, 2, w // 2, 2).permute(0, 2, 4, 1, 3, 5).reshape(b, (h // 2) * (w // 2), c * 4)


def unpack(latents: torch.Tensor, h: int, w: int) -> torch.Tensor:
    """[B, h/2 * w/2, 4C] -> [B, C, h, w] (the pipeline's `_unpack_latents`, without the frame axis)."""
    b, _, c4 = latents.shape
    return latents.view(b, h // 2, w // 2, c4 // 4, 2, 2).permute(0, 3, 1, 4, 2, 5).reshape(b, c4 // 4, h, w)


# -- pre ---------------------------------------------------------------------------------------------
@dataclass
class QwenEditPreParams(ImageLimits, UploadLimits):
    checkpoint: str = ""
    image_area: int = 1024 * 1024       # the pipelines': input images are resized to about this many pixels
    vl_image_area: int = 384 * 384      # Plus: the text encoder's copy of each image (Edit uses the one above)
    max_input_images: int = 0           # 0: the model's (Edit 1; Plus 3, as its model card advises)
    max_prompt_tokens: int = 1024       # the pipelines' tokenizer_max_length


@register("qwen_image_edit_pre")
class QwenEditPre(Step):
    inputs = (*REQUEST_INPUTS, TensorSpec("image", "TYPE_STRING", (-1,), optional=True))
    outputs = (
        TensorSpec("text_ids", "TYPE_INT32", (-1, -1)),          # [1 or 2, L]: prompt (, negative), right-padded
        TensorSpec("text_mask", "TYPE_INT32", (-1, -1)),
        TensorSpec("pixel_values", "TYPE_FP32", (-1, -1)),       # [patches, 3 * 2 * 14 * 14]: every image's
        TensorSpec("image_grid_thw", "TYPE_INT64", (-1, 3)),     # [images, 3]
        TensorSpec("condition_pixels", "TYPE_UINT8", (-1,)),     # each resized image's H * W * 3 bytes, in turn
        TensorSpec("condition_sizes", "TYPE_INT32", (-1, 2)),    # [images, (height, width)]
        *SETTINGS,
    )
    Params = QwenEditPreParams

    def __init__(self, ctx: StepContext):
        super().__init__(ctx)
        from transformers import AutoImageProcessor, AutoTokenizer

        folder = pipeline_folder(ctx, self.params.checkpoint)
        # The pipeline tokenizes with its processor's tokenizer, so both come from processor/.
        path = str(folder / "processor")
        self.tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
        self.image_processor = AutoImageProcessor.from_pretrained(path, local_files_only=True)
        self.plus = is_plus(folder)
        self.max_images = self.params.max_input_images or (3 if self.plus else 1)
        self.multiple = vae_scale_factor(folder) * 2            # VAE factor x the 2x2 latent patches
        self.limits = ImageLimits(**{f.name: getattr(self.params, f.name) for f in dataclasses.fields(ImageLimits)})

    def input_limits(self) -> dict:
        return {"image": (self.max_images,)}

    def resized(self, image, area: int):
        width, height = calculate_dimensions(area, image.width / image.height)
        # Qwen2-VL's image processor refuses aspect ratios beyond 200:1.
        if width == 0 or height == 0 or max(width, height) > 200 * min(width, height):
            raise InvalidInput("image", f"a {image.width}x{image.height} image is too narrow to edit (at most 200:1, "
                                        f"and {area} pixels must hold a side of 32)")
        from PIL import Image

        # VaeImageProcessor.resize: PIL Lanczos (returns a copy when the size already matches).
        return image.resize((width, height), resample=Image.LANCZOS)

    def text_ids(self, texts: list[str], grid: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        merge = self.image_processor.merge_size ** 2
        pads = [IMAGE_PAD * (int(np.prod(g)) // merge) for g in grid]        # Qwen2VLProcessor's expansion
        if self.plus:
            slots = "".join(f"Picture {i + 1}: " + VISION.format(p) for i, p in enumerate(pads))
        else:
            slots = VISION.format(pads[0])
        rows = [self.tokenizer(TEMPLATE.format(slots + t))["input_ids"] for t in texts]
        length = max(len(r) for r in rows)
        ids, mask = np.zeros((len(rows), length), np.int32), np.zeros((len(rows), length), np.int32)
        for i, r in enumerate(rows):
            ids[i, :len(r)], mask[i, :len(r)] = r, 1
        return ids, mask

    def one(self, req: Request) -> dict:
        r = parse_request(req, self.multiple, self.limits)
        images = decode_inputs(req, self.max_images, self.params)
        # CFG when guidance > 1 (the pipeline's true_cfg_scale). The pipeline also wants a negative
        # prompt; without one the model card's " " stands in, so guidance always means CFG here.
        texts = [r.prompt] + ([r.negative_prompt or " "] if r.guidance_scale > 1 else [])
        for name, text in zip(("prompt", "negative_prompt"), texts):
            if any(t in text for t in VISION_TOKENS):
                raise InvalidInput(name, f"must not contain the vision tokens {', '.join(VISION_TOKENS)}")
            if len(self.tokenizer(text)["input_ids"]) > self.params.max_prompt_tokens:
                raise InvalidInput(name, f"longer than {self.params.max_prompt_tokens} tokens")
        vae_images = [self.resized(im, self.params.image_area) for im in images]
        vl_images = [self.resized(im, self.params.vl_image_area) for im in images] if self.plus else vae_images
        if (req.string("size", "") or "").strip().lower() in ("", "auto"):
            # The pipeline's default: the (last) input image's aspect at image_area, snapped to the multiple.
            w, h = calculate_dimensions(self.params.image_area, images[-1].width / images[-1].height)
            r.width, r.height = parse_size(f"{w}x{h}", self.multiple, self.limits)     # within the limits
        vl = self.image_processor(images=vl_images, return_tensors="np")
        ids, mask = self.text_ids(texts, vl["image_grid_thw"])
        return {"text_ids": ids, "text_mask": mask,
                "pixel_values": np.asarray(vl["pixel_values"], np.float32),
                "image_grid_thw": np.asarray(vl["image_grid_thw"], np.int64),
                "condition_pixels": np.concatenate([np.asarray(im, np.uint8).reshape(-1) for im in vae_images]),
                "condition_sizes": np.array([[im.height, im.width] for im in vae_images], np.int32),
                **settings_tensors(r)}


# -- VAE encode ----------------------------------------------------------------------------------------
@register("qwen_image_edit_vae_encode")
class QwenEditVaeEncode(Step):
    inputs = CONDITION_INPUTS
    outputs = (
        TensorSpec("image_latents", "TYPE_FP32", (-1, -1)),      # [tokens of every image, 4C]: packed, in order
        TensorSpec("image_shapes", "TYPE_INT32", (-1, 3)),       # [images, (1, h/2, w/2)]: each one's token grid
    )
    Params = EditModelParams

    def __init__(self, ctx: StepContext):
        super().__init__(ctx)
        self.device = ctx.device
        folder = pipeline_folder(ctx, self.params.checkpoint)
        self.vae = load_component(folder, "vae", self.params.dtype, self.device)
        self.mean, self.std = latent_stats(self.vae, self.device, self.vae.dtype)
        self.multiple = vae_scale_factor(folder) * 2

    def input_limits(self) -> dict:
        return condition_limits(self.params)

    def execute(self, requests: list[Request]) -> list[dict | BaseException]:
        results: list[dict | BaseException | None] = [None] * len(requests)
        images = []          # (slot, index in its request, [H, W, 3] uint8 on the host)
        counts: dict[int, int] = {}
        for slot, req in enumerate(requests):
            try:
                mine = condition_images(req, self.multiple, self.params)
            except InvalidInput as exc:          # this request fails alone
                results[slot] = exc
                continue
            counts[slot] = len(mine)
            images += [(slot, i, image) for i, image in enumerate(mine)]
        encoded: dict[tuple[int, int], torch.Tensor] = {}
        failed: dict[int, BaseException] = {}
        for group in group_by(images, lambda it: it[2].shape).values():
            try:
                with torch.inference_mode():
                    u8 = torch.from_numpy(np.stack([it[2] for it in group])).to(self.device)
                    # VaeImageProcessor.preprocess: /255 in float32, then 2x - 1; [B, 3, 1 frame, H, W].
                    x = (u8.permute(0, 3, 1, 2).float() / 255.0 * 2.0 - 1.0).unsqueeze(2).to(self.vae.dtype)
                    z = self.vae.encode(x).latent_dist.mode()[:, :, 0]           # argmax, as the pipeline
                    z = pack((z - self.mean) / self.std).float()
                for (slot, i, _), lat in zip(group, z):
                    encoded[(slot, i)] = lat
            except Exception as exc:  # noqa: BLE001 - this size fails, the others go on
                for slot, _, _ in group:
                    failed[slot] = exc
        for slot, count in counts.items():
            if slot in failed:
                results[slot] = failed[slot]
                continue
            sizes = host(requests[slot].get("condition_sizes")).reshape(-1, 2)
            m = self.multiple
            results[slot] = {
                "image_latents": to_output(torch.cat([encoded[(slot, i)] for i in range(count)])),
                "image_shapes": np.array([[1, h // m, w // m] for h, w in sizes.tolist()], np.int32)}
        return results


# -- text encoder --------------------------------------------------------------------------------------
@dataclass
class QwenEditTextEncoderParams(EditTextEncoderParams):
    drop_tokens: int = 64        # the pipelines' prompt_template_encode_start_idx: the system prompt's tokens


@register("qwen_image_edit_text_encoder")
class QwenEditTextEncoder(EditTextEncoder):
    """Qwen2.5-VL: the embeddings are its last hidden states (the shared step's default)."""
    Params = QwenEditTextEncoderParams


# -- denoise -------------------------------------------------------------------------------------------
@dataclass
class EditJob(Job):
    image: torch.Tensor | None = None                 # [tokens, 4C] packed image latents, on the device
    image_shapes: tuple = field(default_factory=tuple)  # ((1, h/2, w/2), ...) per input image


@register("qwen_image_edit_denoise")
class QwenEditDenoise(DenoiseStep):
    inputs = (*DenoiseStep.inputs,
              TensorSpec("image_latents", "TYPE_FP32", (-1, -1), ragged=True),
              TensorSpec("image_shapes", "TYPE_INT32", (-1, 3), ragged=True))
    Params = EditDenoiseParams

    def input_limits(self) -> dict:
        images = self.params.max_condition_images
        return {**super().input_limits(), "image_shapes": (images, None),
                "image_latents": (images * self.params.max_pixels // self.multiple ** 2, None)}

    def job(self, slot: int, req: Request) -> EditJob:
        base = super().job(slot, req)
        latents = req.get("image_latents")
        if latents is None or latents.shape[0] == 0:
            raise InvalidInput("image_latents", "no image latents")
        shapes = tuple(tuple(s) for s in host(req.get("image_shapes")).reshape(-1, 3).tolist())
        if not shapes or any(t != 1 or h < 1 or w < 1 for t, h, w in shapes):
            raise InvalidInput("image_shapes", f"{list(shapes)}: expected one (1, h, w) token grid per input image")
        tokens = sum(h * w for _, h, w in shapes)
        if tuple(latents.shape) != (tokens, self.transformer.config.in_channels):
            raise InvalidInput("image_latents", f"shape {list(latents.shape)}; image_shapes and this model give "
                                                f"[{tokens}, {self.transformer.config.in_channels}]")
        return EditJob(**{f.name: getattr(base, f.name) for f in dataclasses.fields(Job)},
                       image=to_torch(latents, self.device, torch.float32), image_shapes=shapes)

    def latent_shape(self, job: Job) -> tuple[int, ...]:
        s = self.vae_scale * 2
        return self.transformer.config.in_channels // 4, 2 * (job.height // s), 2 * (job.width // s)

    def group_key(self, job: EditJob) -> Hashable:
        return self.latent_shape(job), job.steps, job.image_shapes

    def schedule(self, steps: int, image_seq_len: int):
        from diffusers.pipelines.qwenimage.pipeline_qwenimage_edit import calculate_shift

        cfg = self.scheduler.config
        mu = calculate_shift(image_seq_len, cfg.get("base_image_seq_len", 256), cfg.get("max_image_seq_len", 4096),
                             cfg.get("base_shift", 0.5), cfg.get("max_shift", 1.15))
        self.scheduler.set_timesteps(sigmas=np.linspace(1.0, 1 / steps, steps), device="cpu", mu=mu)
        return self.scheduler.timesteps.to(self.device), self.scheduler.sigmas.to(self.device)

    def text_batch(self, texts: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Embeddings of different lengths padded into one [rows, L, D] batch, with the mask the
        transformer uses to ignore the padding (None when there is none, as the pipeline passes it)."""
        length = max(t.shape[0] for t in texts)
        if all(t.shape[0] == length for t in texts):
            return torch.stack(texts), None
        batch = torch.stack([torch.nn.functional.pad(t, (0, 0, 0, length - t.shape[0])) for t in texts])
        lengths = torch.tensor([t.shape[0] for t in texts], device=self.device)
        return batch, torch.arange(length, device=self.device)[None] < lengths[:, None]

    def run(self, jobs: list[EditJob], noise: torch.Tensor) -> torch.Tensor:
        batch, _, h, w = noise.shape
        steps = jobs[0].steps
        timesteps, sigmas = self.staged_schedule((steps, h, w), lambda: self.schedule(steps, (h // 2) * (w // 2)))
        g = self.guidance(jobs)
        cfg = g.rows is not None
        context, mask = self.text_batch([j.prompt for j in jobs for _ in range(j.n)] + g.negatives)
        image = torch.stack([j.image for j in jobs for _ in range(j.n)])                  # [B, S, 4C]
        if cfg:
            image = torch.cat([image, image.index_select(0, g.rows)])
            scale = g.scale.view(-1, 1, 1)
        img_shapes = [[(1, h // 2, w // 2), *jobs[0].image_shapes]] * context.shape[0]
        latents = pack(noise)                                                             # [B, h*w/4, 4C]
        tokens = latents.shape[1]
        for i in range(steps):
            x = latents if not cfg else torch.cat([latents, latents.index_select(0, g.rows)])
            x = torch.cat([x, image], dim=1).to(self.dtype)
            timestep = timesteps[i].expand(x.shape[0]).to(torch.float32) / 1000
            out = self.transformer(hidden_states=x, timestep=timestep, encoder_hidden_states=context,
                                   encoder_hidden_states_mask=mask, img_shapes=img_shapes, return_dict=False)[0]
            out = out[:, :tokens].float()
            pred = out[:batch]
            if cfg:
                pos, neg = pred.index_select(0, g.rows), out[batch:]
                guided = neg + scale * (pos - neg)
                guided = guided * (torch.norm(pos, dim=-1, keepdim=True) / torch.norm(guided, dim=-1, keepdim=True))
                pred = pred.index_copy(0, g.rows, guided)
            # Flow-match Euler step (FlowMatchEulerDiscreteScheduler.step), kept in float32.
            latents = latents + (sigmas[i + 1] - sigmas[i]) * pred
        return unpack(latents, h, w)


# -- VAE decode ----------------------------------------------------------------------------------------
@register("qwen_image_edit_vae_decode")
class QwenEditVaeDecode(OneFrameVaeDecode):
    def to_vae_space(self, latents: torch.Tensor) -> torch.Tensor:
        mean, std = latent_stats(self.vae, latents.device, latents.dtype)
        return latents / (1.0 / std) + mean
