"""JoyAI-Image-Edit (route image_edit): the steps of diffusers' `JoyImageEditPipeline`.

pre           checks the request and decodes the input image. The output size is the pipeline's
              bucket (a fixed table of ~1024x1024 sizes) whose aspect ratio is nearest the requested
              size's, or the input image's when no size is given; the input image is scaled to cover
              that bucket (bilinear) and centre-cropped to it. The Qwen3-VL image processor's patches
              and the prompt template (the image placeholder expanded to one token per merged patch,
              as Qwen3VLProcessor expands it) are made here, on the CPU.
vae_encode    AutoencoderKLWan on the cropped image (one frame), normalised by the per-channel
              latents_mean / latents_std.
text_encoder  Qwen3-VL with the image in the prompt; the output of the last decoder layer before the
              final norm (what the pipeline captures with a hook), less the first `drop_tokens`.
denoise       JoyImageEditTransformer3DModel on two items, [image latents, noise]; only the noise
              item's prediction is used. The scheduler's own timesteps (static shift). CFG when
              guidance > 1: neg + g (pos - neg), rescaled per position to the norm of the conditional
              prediction. The transformer takes no text mask, so rows are batched only with rows whose
              text has the same length (padding would change what the others attend to).
vae_decode    latents * std + mean, decoded as one frame.

One deliberate difference: the pipeline takes a *sample* of the VAE's posterior for the input image,
drawn from torch's global generator (no seed reaches it), which no server can reproduce per request;
here it is the posterior's mode, so a seed fixes the whole result.
"""
from __future__ import annotations

import dataclasses
import functools
import math
from dataclasses import dataclass

import numpy as np
import torch

from triton_omni.image.checkpoint import load_component, pipeline_folder, vae_scale_factor
from triton_omni.image.denoise import DenoiseStep, Job
from triton_omni.image.edit import (CONDITION_INPUTS, IMAGE_PAD, VISION_TOKENS, EditModelParams,
                                    EditTextEncoder, EditTextEncoderParams, OneFrameVaeDecode, UploadLimits,
                                    condition_images, condition_limits, decode_inputs, latent_stats)
from triton_omni.image.pre import REQUEST_INPUTS, SETTINGS, settings_tensors
from triton_omni.image.request import ImageLimits, parse_request
from triton_omni.image.tensors import group_by, to_output, to_torch
from triton_omni.runtime.errors import InvalidInput
from triton_omni.runtime.spec import TensorSpec
from triton_omni.runtime.step import Request, Step, StepContext, register

# The pipeline's "multiple_images" template with its one image slot filled in ("<image>\n" becomes
# the vision tokens); the first `drop_tokens` tokens (the system part) are dropped from the embeddings.
TEMPLATE = ("<|im_start|>system\n \\nDescribe the image by detailing the color, shape, size, texture, quantity, "
            "text, spatial relationships of the objects and background:<|im_end|>\n"
            "<|im_start|>user\n<|vision_start|>{image}<|vision_end|>{prompt}<|im_end|>\n<|im_start|>assistant\n")


@functools.lru_cache(maxsize=None)
def release_buckets() -> tuple[tuple[int, int], ...]:
    """The pipeline's (height, width) buckets for its base size 1024, read from diffusers (once)."""
    from diffusers.pipelines.joyimage.image_processor import BUCKETS

    return tuple(BUCKETS[1024])


def nearest_bucket(height: int, width: int, buckets) -> tuple[int, int]:
    """The bucket whose height/width ratio is closest to height/width (the first one on a tie)."""
    ratio = height / width
    return min(buckets, key=lambda hw: abs(hw[0] / hw[1] - ratio))


def cover_and_crop(image, height: int, width: int):
    """Scale (bilinear) so the image covers height x width, then cut out the centre."""
    from PIL import Image

    scale = max(height / image.height, width / image.width)
    w, h = math.ceil(image.width * scale), math.ceil(image.height * scale)
    left, top = (w - width) // 2, (h - height) // 2
    return image.resize((w, h), Image.BILINEAR).crop((left, top, left + width, top + height))


# -- pre ---------------------------------------------------------------------------------------------
@dataclass
class JoyEditPreParams(ImageLimits, UploadLimits):
    checkpoint: str = ""
    base_size: int = 1024                # the pipeline's buckets scaled by base_size / 1024 (sides must stay
                                         #   multiples of 16); a smaller base serves smaller images
    drop_tokens: int = 34                # the pipeline's prompt_template_encode_start_idx
    max_sequence_length: int = 4096      # the pipeline's: prompt embeddings (image tokens included) at most


@register("joyai_image_edit_pre")
class JoyEditPre(Step):
    inputs = (*REQUEST_INPUTS, TensorSpec("image", "TYPE_STRING", (-1,), optional=True))
    outputs = (
        TensorSpec("text_ids", "TYPE_INT32", (-1, -1)),          # [1 or 2, L]: prompt (, negative), right-padded
        TensorSpec("text_mask", "TYPE_INT32", (-1, -1)),
        TensorSpec("pixel_values", "TYPE_FP32", (-1, -1)),       # [patches, 3 * 2 * 16 * 16]
        TensorSpec("image_grid_thw", "TYPE_INT64", (-1, 3)),     # [1, 3]
        TensorSpec("condition_pixels", "TYPE_UINT8", (-1,)),     # the cropped image's H * W * 3 bytes
        TensorSpec("condition_sizes", "TYPE_INT32", (-1, 2)),    # [1, (height, width)]
        *SETTINGS,
    )
    Params = JoyEditPreParams

    def __init__(self, ctx: StepContext):
        super().__init__(ctx)
        from transformers import AutoImageProcessor, AutoTokenizer

        folder = pipeline_folder(ctx, self.params.checkpoint)
        path = str(folder / "processor")              # the pipeline tokenizes with its processor's tokenizer
        self.tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
        self.image_processor = AutoImageProcessor.from_pretrained(path, local_files_only=True)
        multiple = vae_scale_factor(folder) * 2       # VAE factor x the transformer's 2x2 patches
        base = self.params.base_size
        self.buckets = tuple((h * base // 1024, w * base // 1024) for h, w in release_buckets())
        if any((h * base) % 1024 or (w * base) % 1024 or h % multiple or w % multiple for h, w in self.buckets):
            raise ValueError(f"{ctx.model_name}: base_size {base} makes buckets that are not multiples of {multiple}")
        self.limits = ImageLimits(**{f.name: getattr(self.params, f.name) for f in dataclasses.fields(ImageLimits)})

    def input_limits(self) -> dict:
        return {"image": (1,)}

    def text_ids(self, texts: list[str], grid: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        pads = IMAGE_PAD * (int(np.prod(grid[0])) // self.image_processor.merge_size ** 2)   # the processor's expansion
        rows = [self.tokenizer(TEMPLATE.format(image=pads, prompt=t))["input_ids"] for t in texts]
        length = max(len(r) for r in rows)
        ids, mask = np.zeros((len(rows), length), np.int32), np.zeros((len(rows), length), np.int32)
        for i, r in enumerate(rows):
            ids[i, :len(r)], mask[i, :len(r)] = r, 1
        return ids, mask

    def one(self, req: Request) -> dict:
        # Multiple 1: any valid size only picks the bucket's aspect ratio, as the pipeline's height/width do.
        r = parse_request(req, 1, self.limits)
        [image] = decode_inputs(req, 1, self.params)
        # CFG when guidance > 1; the pipeline's default negative prompt is "".
        texts = [r.prompt] + ([r.negative_prompt] if r.guidance_scale > 1 else [])
        for name, text in zip(("prompt", "negative_prompt"), texts):
            if any(t in text for t in VISION_TOKENS):
                raise InvalidInput(name, f"must not contain the vision tokens {', '.join(VISION_TOKENS)}")
        sized = (req.string("size", "") or "").strip().lower() not in ("", "auto")
        height, width = nearest_bucket(r.height, r.width, self.buckets) if sized else \
            nearest_bucket(image.height, image.width, self.buckets)
        cropped = cover_and_crop(image, height, width)
        vl = self.image_processor(images=[cropped], return_tensors="np")
        ids, mask = self.text_ids(texts, vl["image_grid_thw"])
        for name, row in zip(("prompt", "negative_prompt"), mask):
            # The pipeline would keep only the last max_sequence_length embeddings; refuse instead.
            if int(row.sum()) - self.params.drop_tokens > self.params.max_sequence_length:
                raise InvalidInput(name, f"too long: with the image, at most {self.params.max_sequence_length} "
                                         "tokens of prompt embeddings")
        return {"text_ids": ids, "text_mask": mask,
                "pixel_values": np.asarray(vl["pixel_values"], np.float32),
                "image_grid_thw": np.asarray(vl["image_grid_thw"], np.int64),
                "condition_pixels": np.asarray(cropped, np.uint8).reshape(-1),
                "condition_sizes": np.array([[height, width]], np.int32),
                **settings_tensors(r, width, height)}


# -- VAE encode ----------------------------------------------------------------------------------------
@register("joyai_image_edit_vae_encode")
class JoyEditVaeEncode(Step):
    inputs = CONDITION_INPUTS
    outputs = (TensorSpec("image_latents", "TYPE_FP32", (-1, -1, -1)),)     # [C, h, w], normalised
    Params = EditModelParams

    def __init__(self, ctx: StepContext):
        super().__init__(ctx)
        self.device = ctx.device
        folder = pipeline_folder(ctx, self.params.checkpoint)
        self.vae = load_component(folder, "vae", self.params.dtype, self.device)
        self.mean, self.std = latent_stats(self.vae, self.device, torch.float32)
        self.multiple = vae_scale_factor(folder) * 2          # the buckets' sides

    def input_limits(self) -> dict:
        return {**condition_limits(self.params), "condition_sizes": (1, None)}     # one input image

    def execute(self, requests: list[Request]) -> list[dict | BaseException]:
        results: list[dict | BaseException | None] = [None] * len(requests)
        images = []
        for slot, req in enumerate(requests):
            try:
                [image] = condition_images(req, self.multiple, self.params)
            except InvalidInput as exc:          # this request fails alone
                results[slot] = exc
                continue
            images.append((slot, image))
        for group in group_by(images, lambda it: it[1].shape).values():
            try:
                with torch.inference_mode():
                    u8 = torch.from_numpy(np.stack([it[1] for it in group])).to(self.device)
                    # The pipeline's x / 127.5 - 1; [B, 3, 1 frame, H, W].
                    x = (u8.permute(0, 3, 1, 2).float() / 127.5 - 1.0).unsqueeze(2).to(self.vae.dtype)
                    z = self.vae.encode(x).latent_dist.mode()[:, :, 0].float()     # the mode: see the module doc
                    z = (z - self.mean) / self.std
                for (slot, _), lat in zip(group, z):
                    results[slot] = {"image_latents": to_output(lat)}
            except Exception as exc:  # noqa: BLE001 - this size fails, the others go on
                for slot, _ in group:
                    results[slot] = exc
        return results


# -- text encoder --------------------------------------------------------------------------------------
@dataclass
class JoyEditTextEncoderParams(EditTextEncoderParams):
    drop_tokens: int = 34        # the pipeline's prompt_template_encode_start_idx: the system prompt's tokens


@register("joyai_image_edit_text_encoder")
class JoyEditTextEncoder(EditTextEncoder):
    """The shared edit text encoder's batching (every prompt and negative row in one padded call) with
    this model's embeddings: the last decoder layer's output before the final norm."""
    Params = JoyEditTextEncoderParams

    def hidden_states(self, **inputs) -> torch.Tensor:
        """The model was trained on the last layer's output before the final norm (newer transformers
        return the normed state as hidden_states[-1], so it is captured directly)."""
        captured = {}

        def keep(_module, _args, output):
            captured["hidden"] = output[0] if isinstance(output, tuple) else output

        handle = self.text_encoder.model.language_model.layers[-1].register_forward_hook(keep)
        try:
            self.text_encoder.model(**inputs, mm_token_type_ids=(inputs["input_ids"] == self.image_token).long(),
                                    use_cache=False)     # image tokens marked as the processor marks them
        finally:
            handle.remove()
        return captured["hidden"]


# -- denoise -------------------------------------------------------------------------------------------
@dataclass
class JoyEditJob(Job):
    image: torch.Tensor | None = None        # [C, h, w] normalised image latents, on the device


@register("joyai_image_edit_denoise")
class JoyEditDenoise(DenoiseStep):
    inputs = (*DenoiseStep.inputs, TensorSpec("image_latents", "TYPE_FP32", (-1, -1, -1), ragged=True))

    def input_limits(self) -> dict:
        side = self.params.max_side // self.vae_scale
        return {**super().input_limits(), "image_latents": (None, side, side)}

    def job(self, slot: int, req: Request) -> JoyEditJob:
        base = super().job(slot, req)
        latents = req.get("image_latents")
        if latents is None or latents.shape[0] == 0:
            raise InvalidInput("image_latents", "no image latents")
        if tuple(latents.shape) != self.latent_shape(base):
            raise InvalidInput("image_latents", f"shape {list(latents.shape)}; this model and the output size give "
                                                f"{list(self.latent_shape(base))}")
        image = to_torch(latents, self.device, torch.float32)
        return JoyEditJob(**{f.name: getattr(base, f.name) for f in dataclasses.fields(Job)}, image=image)

    def latent_shape(self, job: Job) -> tuple[int, ...]:
        # The pipeline draws [n, 1 item, C, 1 frame, h, w]: the same numbers as [n, C, h, w].
        return self.transformer.config.in_channels, job.height // self.vae_scale, job.width // self.vae_scale

    def schedule(self, steps: int):
        self.scheduler.set_timesteps(steps, device="cpu")
        return self.scheduler.timesteps.to(self.device), self.scheduler.sigmas.to(self.device)

    def run(self, jobs: list[JoyEditJob], latents: torch.Tensor) -> torch.Tensor:
        batch = latents.shape[0]
        steps = jobs[0].steps
        timesteps, sigmas = self.staged_schedule(steps, lambda: self.schedule(steps))
        g = self.guidance(jobs)
        # One model row per image (its prompt) and per guided image (its negative prompt); row r
        # denoises latents[latent_of[r]] next to its request's image latents.
        texts = [j.prompt for j in jobs for _ in range(j.n)] + g.negatives
        images = [j.image for j in jobs for _ in range(j.n)]
        latent_of = list(range(batch)) + (g.rows.tolist() if g.rows is not None else [])
        # The transformer has no text mask: rows share a call only when their texts have the same length.
        calls = []
        for rows in group_by(range(len(texts)), lambda r: texts[r].shape[0]).values():
            index = torch.tensor(rows, device=self.device)
            calls.append((index, torch.tensor([latent_of[r] for r in rows], device=self.device),
                          torch.stack([texts[r] for r in rows]),
                          torch.stack([images[latent_of[r]] for r in rows]).unsqueeze(2).to(self.dtype)))
        for i in range(steps):
            preds = latents.new_empty((len(texts), *latents.shape[1:]))
            for index, rows_latents, text, image in calls:
                noise = latents.index_select(0, rows_latents).unsqueeze(2).to(self.dtype)
                x = torch.stack([image, noise], dim=1)                        # [k, 2 items, C, 1, h, w]
                out = self.transformer(hidden_states=x, timestep=timesteps[i].expand(x.shape[0]),
                                       encoder_hidden_states=text, return_dict=False)[0]
                preds.index_copy_(0, index, out[:, 1, :, 0].float())          # the noise item's prediction
            pred = preds[:batch]
            if g.rows is not None:
                pos, neg = pred.index_select(0, g.rows), preds[batch:]
                guided = neg + g.scale.view(-1, 1, 1, 1) * (pos - neg)
                # Rescaled per position to the conditional prediction's norm over channels.
                norm = torch.norm(pos, dim=1, keepdim=True) / torch.norm(guided, dim=1, keepdim=True).clamp_min(1e-6)
                pred = pred.index_copy(0, g.rows, guided * norm)
            # Flow-match Euler step (FlowMatchEulerDiscreteScheduler.step), kept in float32.
            latents = latents + (sigmas[i + 1] - sigmas[i]) * pred
        return latents


# -- VAE decode ----------------------------------------------------------------------------------------
@register("joyai_image_edit_vae_decode")
class JoyEditVaeDecode(OneFrameVaeDecode):
    """The one-frame decode of a Wan-family VAE, with this pipeline's denormalisation."""

    def to_vae_space(self, latents: torch.Tensor) -> torch.Tensor:
        mean, std = latent_stats(self.vae, latents.device, latents.dtype)
        return latents * std + mean
