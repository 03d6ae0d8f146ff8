"""The VAE steps shared by the video models: the first frame in, its conditioning latents out
(`VaeEncodeStep`), and a finished clip's latents in, its frames out (`VaeDecodeStep`).

Requests whose tensors have the same shape run in one call (at most `decode_batch` clips: a whole
720p clip's activations take gigabytes). The decode is whole-clip, as the pipelines decode (the Wan
VAEs run their causal decoder frame group by frame group with a feature cache, so memory stays
bounded by a frame group, not the clip). Each step keeps only its half of the VAE in memory. A model
subclass says how latents map into the VAE's space and what a first frame becomes.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from triton_omni.diffusion.checkpoint import load_component, pipeline_folder
from triton_omni.diffusion.tensors import group_by, to_output, to_torch, to_uint8
from triton_omni.runtime.errors import InvalidInput
from triton_omni.runtime.spec import TensorSpec
from triton_omni.runtime.step import Request, Step, StepContext
from triton_omni.video.request import ServedClips, check_frames, check_size


@dataclass
class VideoVaeParams(ServedClips):
    checkpoint: str = ""
    dtype: str = "float32"
    compile: bool = False              # GPU: torch.compile the decode (a new latent shape compiles on first use)
    channels_last: bool = False        # GPU: the 3-D convolutions in channels-last-3d memory format
    cudnn_benchmark: bool = False      # GPU: cuDNN times its convolution algorithms per shape and keeps the
                                       #   fastest (this process's setting; the first clip of a size pays for it)
    decode_batch: int = 1              # clips of one shape in one VAE call at most


def frames_uint8(video: torch.Tensor) -> torch.Tensor:
    """VAE output [B, 3, F, H, W] in [-1, 1] -> [B, F, H, W, 3] uint8, rounded as the image models round
    (the pipelines' postprocess_video gives those floats frame by frame)."""
    b, c, f, h, w = video.shape
    return to_uint8(video.transpose(1, 2).reshape(b * f, c, h, w)).reshape(b, f, h, w, 3)


class VideoVaeStep(Step):
    Params = VideoVaeParams
    keep: str = "decoder"              # which half of the VAE this step runs

    def __init__(self, ctx: StepContext):
        super().__init__(ctx)
        self.device = ctx.device
        self.folder = pipeline_folder(ctx, self.params.checkpoint)
        vae = load_component(self.folder, "vae", self.params.dtype, "cpu")
        drop = "encoder" if self.keep == "decoder" else "decoder"
        setattr(vae, drop, None)       # the other half is never run here
        self.vae = vae.to(self.device)
        self.cuda = torch.device(self.device).type == "cuda"
        if self.params.cudnn_benchmark and self.cuda:
            torch.backends.cudnn.benchmark = True
        if self.params.channels_last and self.cuda:
            self.vae = self.vae.to(memory_format=torch.channels_last_3d)
        self.channels, self.scale, self.temporal = self.latent_layout()

    def latent_layout(self) -> tuple[int, int, int]:
        """(latent channels, pixels a side per latent cell, frames per latent frame after the first)."""
        raise NotImplementedError

    def pixel_frames(self, latent_frames: int) -> int:
        return 1 + (latent_frames - 1) * self.temporal

    def chunks(self, group: list) -> list[list]:
        n = max(1, self.params.decode_batch)
        return [group[i:i + n] for i in range(0, len(group), n)]


class VaeDecodeStep(VideoVaeStep):
    inputs = (TensorSpec("latents", "TYPE_FP32", (-1, -1, -1, -1), ragged=True),)    # [C, F, h, w]
    outputs = (TensorSpec("frames", "TYPE_UINT8", (-1, -1, -1, 3)),)                 # [F', H, W, 3]

    def __init__(self, ctx: StepContext):
        super().__init__(ctx)
        if self.params.compile and self.cuda:
            self.decode = torch.compile(self.decode)     # on the bound method: the module stays as it is

    def input_limits(self) -> dict:
        most_latent = 1 + (self.params.max_frames - 1) // self.temporal
        side = self.params.max_side // self.scale
        return {"latents": (None, most_latent, side, side)}

    def to_vae_space(self, latents: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def decode(self, z: torch.Tensor) -> torch.Tensor:
        """VAE-space latents [B, C, F, h, w] -> frames in [-1, 1], [B, 3, F', H, W]."""
        return self.vae.decode(z, return_dict=False)[0]

    def check(self, latents) -> None:
        c, f, h, w = latents.shape
        if c != self.channels:
            raise InvalidInput("latents", f"shape {list(latents.shape)}: this model's latents have "
                                          f"{self.channels} channels")
        if f < 1 or h < 1 or w < 1:
            raise InvalidInput("latents", f"shape {list(latents.shape)}: empty")
        check_size(w * self.scale, h * self.scale, self.scale, self.params, field="latents")
        check_frames(self.pixel_frames(f), self.temporal, self.params, field="latents")

    def execute(self, requests: list[Request]) -> list[dict | BaseException]:
        results: list[dict | BaseException | None] = [None] * len(requests)
        items = []
        for slot, r in enumerate(requests):
            try:
                self.check(r.get("latents"))
                items.append((slot, r.get("latents")))
            except InvalidInput as exc:          # this request fails alone
                results[slot] = exc
        for group in group_by(items, lambda it: tuple(it[1].shape)).values():
            for chunk in self.chunks(group):
                try:
                    with torch.inference_mode():
                        z = torch.cat([to_torch(lat, self.device, torch.float32)[None] for _, lat in chunk])
                        z = self.to_vae_space(z)
                        if self.params.channels_last and self.cuda:
                            z = z.contiguous(memory_format=torch.channels_last_3d)
                        frames = frames_uint8(self.decode(z))
                    for (slot, _), clip in zip(chunk, frames):
                        results[slot] = {"frames": to_output(clip)}
                except Exception as exc:  # noqa: BLE001 - this chunk fails, the others go on
                    for slot, _ in chunk:
                        results[slot] = exc
        return results


class VaeEncodeStep(VideoVaeStep):
    """The first frame (uint8 pixels, already at the clip's size) -> the model's conditioning tensor;
    a request without a first frame gets an empty one."""
    keep = "encoder"
    inputs = (
        TensorSpec("first_frame", "TYPE_UINT8", (-1, -1, 3), ragged=True),      # [H, W, 3]; [0, 0, 3]: none
        TensorSpec("width", "TYPE_INT32", (1,)),
        TensorSpec("height", "TYPE_INT32", (1,)),
        TensorSpec("num_frames", "TYPE_INT32", (1,)),
    )
    outputs = (TensorSpec("condition", "TYPE_FP32", (-1, -1, -1, -1)),)       # [C, F, h, w]; [0, 0, 0, 0]: none

    def input_limits(self) -> dict:
        return {"first_frame": (self.params.max_side, self.params.max_side, None)}

    def condition(self, pixels: torch.Tensor, num_frames: int) -> torch.Tensor:
        """[B, 3, 1, H, W] float32 in [-1, 1] -> [B, C, F, h, w] conditioning (float32)."""
        raise NotImplementedError

    def execute(self, requests: list[Request]) -> list[dict | BaseException]:
        results: list[dict | BaseException | None] = [None] * len(requests)
        items = []
        for slot, r in enumerate(requests):
            try:
                frame, frames = r.get("first_frame"), int(r.scalar("num_frames"))
                width, height = int(r.scalar("width")), int(r.scalar("height"))
                check_size(width, height, self.scale, self.params, field="width")
                check_frames(frames, self.temporal, self.params)
                if frame.shape[0] == 0:
                    results[slot] = {"condition": to_output(torch.zeros((0, 0, 0, 0)))}
                    continue
                if tuple(frame.shape) != (height, width, 3):
                    raise InvalidInput("first_frame", f"shape {list(frame.shape)}; the clip is {width}x{height}, "
                                                      f"so [{height}, {width}, 3] is expected")
                items.append((slot, frame, frames))
            except InvalidInput as exc:
                results[slot] = exc
        for group in group_by(items, lambda it: (tuple(it[1].shape), it[2])).values():
            for chunk in self.chunks(group):
                try:
                    with torch.inference_mode():
                        pixels = torch.stack([to_torch(f, self.device) for _, f, _ in chunk])      # [B, H, W, 3]
                        # as the pipelines' image processor: / 255, then 2x - 1, in float32
                        pixels = (pixels.float() / 255.0 * 2.0 - 1.0).permute(0, 3, 1, 2).unsqueeze(2)
                        condition = self.condition(pixels, chunk[0][2])
                    for (slot, _, _), c in zip(chunk, condition):
                        results[slot] = {"condition": to_output(c.float())}
                except Exception as exc:  # noqa: BLE001
                    for slot, _, _ in chunk:
                        results[slot] = exc
        return results
