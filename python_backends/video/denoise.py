"""The denoise step shared by the video models: a decoupled step that runs its own loop (loop.py).

Why not Triton's dynamic batcher, as the image models' denoise step has:
- progress: a clip takes minutes, and the step reports every finished step to the request's watcher
  (the model's front relays it to the client, runtime/front.py); a step that answers only when its
  execute returns cannot.
- batching that does not wait for a whole clip: a request that arrives while others are being
  denoised joins their model calls at the next step (each clip keeps its own timesteps and scheduler
  state, and the transformer takes a timestep per row), where Triton's batcher would hold it until
  the running batch's last step.
- cancellation: the front's abort, or the caller's own cancellation, drops a clip between two steps;
  its rows leave the next model call and its slot goes to the next waiting request.
Triton hands this decoupled step its requests one execute each (no dynamic batcher on decoupled
python models here: a stub heap corruption was once seen with one under mass cancellation,
results/ar_decode_notes.md); the loop batches them itself. Its custom metrics on /metrics
(`triton_omni_video_*`) say how many model calls ran and how many clips shared them.

A request is a clip to denoise, or a control request (all inputs optional, so Triton takes either):
`abort_request_id` (the front's: these clients went away) or `progress_request_id` (a watch: stream
this request's progress). A model family says how a clip starts (noise, schedule, conditioning on
the device), which clips can share a call and how one step runs; `guided` batches a group's
conditional rows and its classifier-free-guidance rows in one call.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable, Hashable

import numpy as np
import torch

from triton_omni.diffusion.attention import set_attention
from triton_omni.diffusion.checkpoint import pipeline_folder
from triton_omni.diffusion.tensors import to_torch
from triton_omni.runtime.errors import InvalidInput, Unavailable
from triton_omni.runtime.front import ABORT_INPUT, PROGRESS_INPUT
from triton_omni.runtime.metrics import Gauge
from triton_omni.runtime.spec import TensorSpec
from triton_omni.runtime.step import Request, ResponseSink, Step, StepContext
from triton_omni.video.loop import Clip, DenoiseLoop, LoopStats
from triton_omni.video.request import ServedClips, check_settings

METRICS_S = 0.1        # how often the loop's counters are published


@dataclass
class VideoDenoiseParams(ServedClips):
    checkpoint: str = ""
    dtype: str = "float32"
    compile: bool = False          # GPU: torch.compile each repeated transformer block (regional; a new
                                   #   shape compiles on first use); ignored on CPU
    attention: str = "native"      # the transformer's attention kernel (diffusion/attention.py)
    max_clips: int = 4             # clips denoised at once (their model calls shared); more wait their turn
    max_rows: int = 8              # rows (clips x CFG branches) of one model call at most
    max_waiting_clips: int = 64    # clips waiting for a slot at most; past it UNAVAILABLE at once ("retry later")
    text_len: int = 512            # prompt embeddings are zero-padded to this many tokens (the pipelines'
                                   #   max_sequence_length: the transformer attends to the padding too)


SETTINGS_IN = (
    TensorSpec("width", "TYPE_INT32", (1,), optional=True),
    TensorSpec("height", "TYPE_INT32", (1,), optional=True),
    TensorSpec("num_frames", "TYPE_INT32", (1,), optional=True),
    TensorSpec("fps", "TYPE_INT32", (1,), optional=True),
    TensorSpec("num_inference_steps", "TYPE_INT32", (1,), optional=True),
    TensorSpec("guidance_scale", "TYPE_FP32", (1,), optional=True),
    TensorSpec("guidance_scale_2", "TYPE_FP32", (1,), optional=True),
    TensorSpec("seed", "TYPE_INT64", (1,), optional=True),
)
EMBEDS_IN = (
    TensorSpec("prompt_embeds", "TYPE_FP32", (-1, -1), optional=True, ragged=True),
    TensorSpec("negative_embeds", "TYPE_FP32", (-1, -1), optional=True, ragged=True),   # 0 rows: no CFG
)
CONTROL_IN = (
    TensorSpec(ABORT_INPUT, "TYPE_STRING", (1,), optional=True, control=True),
    TensorSpec(PROGRESS_INPUT, "TYPE_STRING", (1,), optional=True, control=True),
)
# the first frame's VAE latents (and whatever else the model conditions on), [C, F, h, w]; 0 size: none
CONDITION_IN = TensorSpec("condition", "TYPE_FP32", (-1, -1, -1, -1), optional=True, ragged=True)
REQUIRED = ("prompt_embeds", *(t.name for t in SETTINGS_IN))


@dataclass(eq=False)
class ClipState:
    """What a clip holds on the device while it is denoised (a model adds its conditioning)."""

    latents: torch.Tensor                  # [1, C, F, h, w] float32, as the pipelines keep them
    prompt: torch.Tensor                   # [1, text_len, D] in the model's dtype
    negative: torch.Tensor | None          # the same for the negative prompt; None: no CFG
    scheduler: Any                         # the clip's own copy (multistep schedulers keep history)
    timesteps: list[float]                 # on the host: which expert, which guidance, no device sync


@dataclass
class Row:
    """One row of a model call: its input, timestep and text conditioning (each with a batch dim of 1)."""

    x: torch.Tensor
    timestep: torch.Tensor
    context: torch.Tensor


class VideoDenoiseStep(Step):
    decoupled = True
    inputs = (*EMBEDS_IN, *SETTINGS_IN, *CONTROL_IN)         # models that take an image add CONDITION_IN
    outputs = (
        TensorSpec("latents", "TYPE_FP32", (-1, -1, -1, -1)),    # [C, F, h, w] of the finished clip
        TensorSpec("fps", "TYPE_INT32", (1,)),                   # passed on to the encode step
        TensorSpec("progress", "TYPE_INT32", (2,), control=True),   # (steps done, steps): to a watcher
    )
    Params = VideoDenoiseParams

    def __init__(self, ctx: StepContext):
        super().__init__(ctx)
        self.device = ctx.device
        self.folder = pipeline_folder(ctx, self.params.checkpoint)
        self.load()
        for model in self.transformers():
            set_attention(model, self.params.attention, self.device)
            if self.params.compile and torch.device(self.device).type == "cuda":
                model.compile_repeated_blocks(fullgraph=True)
        self.metrics = {k: Gauge(f"triton_omni_video_{k}", d, ctx.model_name) for k, d in (
            ("model_calls", "denoise model calls"), ("model_rows", "rows of all denoise model calls"),
            ("max_call_clips", "most clips that shared one model call"), ("clips_started", "clips received"),
            ("clips_finished", "clips denoised to the end"), ("clips_cancelled", "clips dropped on cancellation"),
            ("clips_failed", "clips that failed"), ("active_clips", "clips being denoised now"),
            ("waiting_clips", "clips waiting for a slot"))}
        self._published = 0.0
        self.loop = DenoiseLoop(self, self.device, self.params.max_clips, self.params.max_rows, ctx.log,
                                self._publish)

    # -- what a model says ----------------------------------------------------------------------
    def load(self) -> None:
        """Load the transformer(s) and the scheduler; set `text_dim`, `multiple`, `temporal`."""
        raise NotImplementedError

    def transformers(self) -> list[torch.nn.Module]:
        raise NotImplementedError

    def uses_cfg(self, guidance_scale: float) -> bool:
        """Whether a clip also runs an unconditional branch (the pre step tokenizes its negative prompt then)."""
        raise NotImplementedError

    def check(self, clip_inputs: dict) -> None:
        """The model's checks of one request's tensors (condition shape, ...), on the host."""

    def start(self, clip: Clip) -> None:
        """The clip's state on the device: initial noise, its own scheduler, its conditioning."""
        raise NotImplementedError

    def group_key(self, clip: Clip) -> Hashable:
        raise NotImplementedError

    def advance(self, clips: list[Clip]) -> None:
        """One denoising step for clips of one group (each clip's `launched` + 1)."""
        raise NotImplementedError

    def result(self, clip: Clip) -> dict:
        raise NotImplementedError

    # -- shared ---------------------------------------------------------------------------------
    def rows(self, clip: Clip) -> int:
        return 1 + (clip.inputs["negative"] is not None)      # the conditional row, and CFG's

    def padded_text(self, embeds: torch.Tensor) -> torch.Tensor:
        """[L, D] real-token embeddings -> [1, text_len, D] with zeros after them, in the model's dtype."""
        dtype = self.transformers()[0].dtype
        out = torch.zeros((1, self.params.text_len, embeds.shape[-1]), dtype=dtype, device=self.device)
        out[0, :embeds.shape[0]] = to_torch(embeds, self.device, dtype)
        return out

    def guided(self, clips: list[Clip], row: Callable[[Clip], Row], call: Callable[[Row], torch.Tensor],
               scale: Callable[[Clip], float]) -> list[torch.Tensor]:
        """Each clip's prediction from one model call: the conditional rows of every clip, then the
        unconditional rows (the same input with the negative prompt) of the clips that use CFG;
        guided as uncond + scale x (cond - uncond), in the model's dtype, as the pipelines combine."""
        rows = [row(c) for c in clips]
        cfg = [i for i, c in enumerate(clips) if c.state.negative is not None]
        every = rows + [Row(rows[i].x, rows[i].timestep, clips[i].state.negative) for i in cfg]
        out = call(Row(torch.cat([r.x for r in every]), torch.cat([r.timestep for r in every]),
                       torch.cat([r.context for r in every])))
        preds = list(out[:len(clips)].split(1))
        for j, i in enumerate(cfg):
            uncond = out[len(clips) + j:len(clips) + j + 1]
            preds[i] = uncond + scale(clips[i]) * (preds[i] - uncond)
        return preds

    def input_limits(self) -> dict:
        tokens = (self.params.text_len, None)
        return {"prompt_embeds": tokens, "negative_embeds": tokens}

    def clip(self, request: Request, sink: ResponseSink) -> Clip:
        """A request's checked tensors as a clip (InvalidInput names what is wrong)."""
        for name in REQUIRED:
            if request.get(name) is None:
                raise InvalidInput(name, "required input is missing")
        settings = check_settings(request, self.multiple, self.temporal, self.params)
        prompt, negative = request.get("prompt_embeds"), request.get("negative_embeds")
        if prompt.shape[0] == 0:
            raise InvalidInput("prompt_embeds", "no prompt embeddings")
        # CFG by the model's rule, not by whether negative tokens came: an empty negative prompt may
        # have no tokens at all, and then the pipelines guide against zeros (its padding)
        if not self.uses_cfg(float(settings["guidance_scale"])):
            negative = None
        elif negative is None:
            negative = np.zeros((0, prompt.shape[1]), np.float32)
        for name, embeds in (("prompt_embeds", prompt), ("negative_embeds", negative)):
            if embeds is not None and embeds.shape[1] != self.text_dim:
                raise InvalidInput(name, f"shape {list(embeds.shape)}: this model takes {self.text_dim} values a token")
        condition = request.get("condition")
        inputs = {**settings, "prompt": prompt, "negative": negative,
                  "condition": condition if condition is not None and condition.size else None}
        self.check(inputs)
        return Clip(request.request_id, sink, int(settings["num_inference_steps"]), inputs)

    def submit(self, request: Request, sink: ResponseSink) -> None:
        aborts = request.string(ABORT_INPUT)
        if aborts is not None:                   # the front: these requests' clients went away
            self.loop.abort([a for a in aborts.split(",") if a])
            sink.send({}, final=True)
            return
        watched = request.string(PROGRESS_INPUT)
        if watched is not None:
            self.loop.watch(watched, sink)
            return
        waiting = self.loop.inbox.qsize() + len(self.loop.waiting)    # read across threads: a bound, not a count
        if waiting >= self.params.max_waiting_clips:
            raise Unavailable(f"{waiting} clips are waiting for this model, the most it queues "
                              f"(max_waiting_clips = {self.params.max_waiting_clips}); retry later")
        self.loop.add(self.clip(request, sink))

    def _publish(self, stats: LoopStats) -> None:
        now = time.monotonic()
        if now - self._published >= METRICS_S:
            self._published = now
            for key, gauge in self.metrics.items():
                gauge.set(getattr(stats, key))

    def close(self) -> None:
        self.loop.stop()

