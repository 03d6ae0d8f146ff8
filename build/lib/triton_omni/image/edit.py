"""What the image-edit models (Qwen-Image-Edit, JoyAI-Image-Edit) share: a Qwen-VL text encoder step
with the input image in the prompt, a one-frame decode of a video VAE with per-channel latent
statistics, and the reference pipelines' processor for the tests.

Both pipelines condition on the input image twice: as vision tokens in the text encoder's prompt, and
as VAE latents beside the noise; the pieces that differ (templates, image sizes, the denoiser) stay in
each model's family.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from triton_omni.image.checkpoint import load_component, pipeline_folder
from triton_omni.image.checks import check_ids
from triton_omni.image.denoise import DenoiseParams
from triton_omni.image.request import ServedSizes
from triton_omni.image.tensors import to_output
from triton_omni.image.vae import VaeDecodeStep
from triton_omni.media.image import ImageDecodeError, decode_image
from triton_omni.runtime.errors import InvalidInput
from triton_omni.runtime.spec import TensorSpec
from triton_omni.runtime.step import Request, Step, StepContext

# Tokens that would make the text encoder look for image or video features the request does not have.
VISION_TOKENS = ("<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>")
IMAGE_PAD = "<|image_pad|>"       # one per merged patch of the image processor's grid
# What the pre steps hand the VAE encode step: the resized input images' bytes and sizes.
CONDITION_INPUTS = (
    TensorSpec("condition_pixels", "TYPE_UINT8", (-1,), ragged=True),     # each image's H * W * 3 bytes, in turn
    TensorSpec("condition_sizes", "TYPE_INT32", (-1, 2), ragged=True),    # [images, (height, width)]
)


@dataclass
class UploadLimits:
    """What a pre step accepts of each uploaded input image, checked before it is decoded."""

    max_input_pixels: int = 4096 * 4096   # larger uploads are refused before they are decoded
    max_input_bytes: int = 32 << 20       # an encoded image's bytes at most


def decode_inputs(req: Request, max_images: int, limits: UploadLimits) -> list:
    """The request's `image` field: 1 to `max_images` encoded images, decoded to RGB PIL images."""
    data = req.get("image")
    items = [] if data is None else list(np.asarray(data, dtype=object).reshape(-1))
    if not items:
        raise InvalidInput("image", "at least one input image is required")
    if len(items) > max_images:
        raise InvalidInput("image", f"{len(items)} images given; this model takes at most {max_images}")
    images = []
    for i, item in enumerate(items):
        where = f"image {i + 1} of {len(items)}"
        if len(item) > limits.max_input_bytes:
            raise InvalidInput("image", f"{where}: {len(item)} bytes; at most {limits.max_input_bytes} are accepted")
        try:
            images.append(decode_image(bytes(item), max_pixels=limits.max_input_pixels))
        except ImageDecodeError as e:
            raise InvalidInput("image", f"{where}: {e}") from None
    return images


@dataclass
class ConditionLimits:
    max_condition_images: int = 3       # input images one request conditions on (Qwen-Image-Edit-Plus: 3)


@dataclass
class EditModelParams(ServedSizes, ConditionLimits):
    checkpoint: str = ""
    dtype: str = "float32"


@dataclass
class EditDenoiseParams(DenoiseParams, ConditionLimits):
    pass


def host(value) -> np.ndarray:
    """A small step input as a host array (a GPU step may be handed it as a GPU tensor)."""
    return value.cpu().numpy() if isinstance(value, torch.Tensor) else np.asarray(value)


def condition_images(req: Request, multiple: int, params: EditModelParams) -> list[np.ndarray]:
    """A VAE encode step's request: each input image as [H, W, 3] uint8 (host), its size checked: sides
    that are multiples of `multiple` (what the VAE and the 2x2 patches take), pixels within the largest served."""
    pixels, sizes = host(req.get("condition_pixels")).reshape(-1), host(req.get("condition_sizes")).reshape(-1, 2)
    if sizes.shape[0] == 0:
        raise InvalidInput("condition_sizes", "no images")
    for h, w in sizes.tolist():
        if h < multiple or w < multiple or h % multiple or w % multiple or h * w > params.max_pixels:
            raise InvalidInput("condition_sizes", f"{h}x{w} (height x width): sides must be multiples of {multiple}, "
                                                  f"at most {params.max_pixels} pixels")
    ends = np.cumsum([h * w * 3 for h, w in sizes.tolist()])
    if ends[-1] != pixels.size:
        raise InvalidInput("condition_pixels", f"{pixels.size} bytes; condition_sizes gives {int(ends[-1])}")
    return [part.reshape(h, w, 3) for part, (h, w) in zip(np.split(pixels, ends[:-1]), sizes.tolist())]


def condition_limits(params: EditModelParams) -> dict:
    """A VAE encode step's bounds: its most images of the largest size served."""
    images = params.max_condition_images
    return {"condition_sizes": (images, None), "condition_pixels": (images * params.max_pixels * 3,)}


def latent_stats(vae, device, dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """The VAE's per-channel latents_mean and latents_std, shaped [1, C, 1, 1]."""
    mean = torch.tensor(vae.config.latents_mean).view(1, -1, 1, 1).to(device, dtype)
    std = torch.tensor(vae.config.latents_std).view(1, -1, 1, 1).to(device, dtype)
    return mean, std


def processor_from_parts(folder, processor_class: str = "Qwen2VLProcessor"):
    """The reference pipeline's processor (transformers' `processor_class`: Qwen2VLProcessor for
    Qwen-Image-Edit, Qwen3VLProcessor for JoyImage-Edit) from processor/'s image processor and tokenizer.
    `from_pretrained` also loads a video processor, which needs torchvision; the edit pipelines never
    pass videos, so the processor is built without one (its constructor's class check would reject the
    missing video processor, hence the subclass). Our steps do not use it."""
    import transformers
    from transformers import AutoImageProcessor, AutoTokenizer

    class ImageOnlyProcessor(getattr(transformers, processor_class)):
        def check_argument_for_proper_class(self, name, arg):
            if name == "video_processor" and arg is None:
                return None
            return super().check_argument_for_proper_class(name, arg)

    path = str(folder / "processor")
    return ImageOnlyProcessor(image_processor=AutoImageProcessor.from_pretrained(path, local_files_only=True),
                              tokenizer=AutoTokenizer.from_pretrained(path, local_files_only=True),
                              video_processor=None)


# -- text encoder --------------------------------------------------------------------------------------
@dataclass
class EditTextEncoderParams(EditModelParams):
    drop_tokens: int = 0         # the pipeline's prompt_template_encode_start_idx: the system prompt's tokens
    max_sequence_length: int = 4096     # prompt embeddings (image tokens included) at most, after drop_tokens


class EditTextEncoder(Step):
    """A Qwen-VL text encoder with the request's images in the prompt. Every row of every request
    (prompt, negative) goes in one padded call; a model says which hidden states are its embeddings
    (`hidden_states`) and how many leading tokens to drop (`Params.drop_tokens`)."""
    inputs = (
        TensorSpec("text_ids", "TYPE_INT32", (-1, -1), ragged=True),
        TensorSpec("text_mask", "TYPE_INT32", (-1, -1), ragged=True),
        TensorSpec("pixel_values", "TYPE_FP32", (-1, -1), ragged=True),
        TensorSpec("image_grid_thw", "TYPE_INT64", (-1, 3), ragged=True),
    )
    outputs = (
        TensorSpec("prompt_embeds", "TYPE_FP32", (-1, -1)),
        TensorSpec("negative_embeds", "TYPE_FP32", (-1, -1)),   # zero rows when the request has no CFG
    )
    Params = EditTextEncoderParams

    def __init__(self, ctx: StepContext):
        super().__init__(ctx)
        self.device = ctx.device
        folder = pipeline_folder(ctx, self.params.checkpoint)
        self.text_encoder = load_component(folder, "text_encoder", self.params.dtype, self.device)
        config = self.text_encoder.config
        vision = config.vision_config
        self.vocab = self.text_encoder.get_input_embeddings().num_embeddings
        self.image_token = config.image_token_id
        self.merge = vision.spatial_merge_size ** 2          # patches per image token
        self.patch_width = vision.in_channels * vision.temporal_patch_size * vision.patch_size ** 2
        self.max_patches = self.params.max_condition_images * (self.params.max_pixels // vision.patch_size ** 2)

    def input_limits(self) -> dict:
        rows = (2, self.params.max_sequence_length + self.params.drop_tokens)    # prompt, negative
        return {"text_ids": rows, "text_mask": rows, "pixel_values": (self.max_patches, None),
                "image_grid_thw": (self.params.max_condition_images, None)}

    def check(self, ids: np.ndarray, mask: np.ndarray, pixels: np.ndarray, grid: np.ndarray) -> None:
        """One request's tensors agree with each other and with the model, as the pre step makes them."""
        check_ids(ids, mask, self.vocab)
        if grid.shape[0] == 0 or grid.min() < 1:
            raise InvalidInput("image_grid_thw", f"{grid.tolist()}: expected one positive (t, h, w) per image")
        patches = int(grid.prod(axis=1).sum())
        if pixels.shape != (patches, self.patch_width):
            raise InvalidInput("pixel_values", f"shape {list(pixels.shape)}; image_grid_thw gives "
                                               f"[{patches}, {self.patch_width}]")
        tokens = ((ids == self.image_token) & (mask > 0)).sum(axis=1)
        if patches % self.merge or (tokens != patches // self.merge).any():
            raise InvalidInput("text_ids", f"{tokens.tolist()} image tokens a row; image_grid_thw needs "
                                           f"{patches / self.merge:g}")

    def hidden_states(self, **inputs) -> torch.Tensor:
        """[rows, tokens, D]: the text embeddings the transformer was trained on (the model's last
        hidden states, without the vocabulary projection)."""
        return self.text_encoder.model(**inputs, output_hidden_states=True, use_cache=False).hidden_states[-1]

    def execute(self, requests: list[Request]) -> list[dict | BaseException]:
        # Every row of every request (prompt, negative: each with its request's images) in one call,
        # right-padded to the longest: the encoder is causal, so padding after a row changes nothing in
        # it, and the multimodal RoPE positions are computed from the attention mask.
        rows = []            # (slot, ids of the real tokens, pixel_values, grid)
        refused: dict[int, BaseException] = {}
        for slot, req in enumerate(requests):
            ids, mask = host(req.get("text_ids")), host(req.get("text_mask"))
            pixels, grid = host(req.get("pixel_values")), host(req.get("image_grid_thw")).reshape(-1, 3)
            try:
                self.check(ids, mask, pixels, grid)
            except InvalidInput as exc:             # this request fails alone
                refused[slot] = exc
                continue
            for r in range(ids.shape[0]):
                rows.append((slot, ids[r][mask[r] > 0], pixels, grid))
        if not rows:
            return [refused[slot] for slot in range(len(requests))]
        length = max(len(r[1]) for r in rows)
        ids = np.zeros((len(rows), length), np.int64)
        mask = np.zeros((len(rows), length), np.int64)
        for i, (_, real, _, _) in enumerate(rows):
            ids[i, :len(real)], mask[i, :len(real)] = real, 1
        try:
            with torch.inference_mode():
                hidden = self.hidden_states(
                    input_ids=torch.from_numpy(ids).to(self.device), attention_mask=torch.from_numpy(mask).to(self.device),
                    pixel_values=torch.from_numpy(np.concatenate([r[2] for r in rows])).to(
                        self.device, self.text_encoder.dtype),
                    image_grid_thw=torch.from_numpy(np.concatenate([r[3] for r in rows])).to(self.device))
        except Exception as exc:  # noqa: BLE001 - the batch fails together
            return [refused.get(slot, exc) for slot in range(len(requests))]
        drop = self.params.drop_tokens
        mine: dict[int, list[torch.Tensor]] = {}
        for i, (slot, real, _, _) in enumerate(rows):
            mine.setdefault(slot, []).append(hidden[i, drop:len(real)].float())
        results = []
        for slot in range(len(requests)):
            if slot in refused:
                results.append(refused[slot])
                continue
            embeds = mine[slot]
            negative = embeds[1] if len(embeds) > 1 else embeds[0].new_zeros((0, embeds[0].shape[-1]))
            results.append({"prompt_embeds": to_output(embeds[0]), "negative_embeds": to_output(negative)})
        return results


# -- VAE decode ----------------------------------------------------------------------------------------
class OneFrame(torch.nn.Module):
    """The video VAE as the shared decode step expects an image VAE: [B, C, h, w] in, [B, 3, H, W] out."""

    def __init__(self, vae):
        super().__init__()
        self.vae = vae

    @property
    def dtype(self):
        return self.vae.dtype

    @property
    def config(self):
        return self.vae.config

    def decode(self, z: torch.Tensor, return_dict: bool = False):
        return (self.vae.decode(z.unsqueeze(2), return_dict=False)[0][:, :, 0],)


class OneFrameVaeDecode(VaeDecodeStep):
    """The shared VAE decode on a video VAE: each image decoded as one frame. A model still says how
    its latents map into the VAE's space (`to_vae_space`)."""

    def __init__(self, ctx: StepContext):
        super().__init__(ctx)
        self.vae = OneFrame(self.vae)

    def latent_layout(self) -> tuple[int, int]:
        return self.vae.config.z_dim, self.vae_scale
