"""/v1/videos: an asynchronous job per video, polled and downloaded as OpenAI's API does it, and a
synchronous variant.

    POST /v1/videos                 -> a `video` object, status "queued"
    GET  /v1/videos/{id}            -> the same object: "in_progress" with `progress` (0-100), then
                                       "completed" or "failed"
    GET  /v1/videos/{id}/content    -> the MP4 (409 until completed)
    GET  /v1/videos, DELETE /v1/videos/{id}
    POST /v1/videos/generations     -> the MP4 itself, once made (the request waits)

Besides OpenAI's fields (prompt, model, seconds, size, input_reference: the first frame) the model's
knobs are accepted as extensions: negative_prompt, num_frames (instead of seconds), fps,
num_inference_steps, guidance_scale, guidance_scale_2, seed. A job's progress is the model's
(steps done / steps of its denoise loop, streamed by the model's front). Jobs run as tasks of the
proxy's event loop and keep their MP4 in memory; the oldest finished jobs are dropped past
`max_video_jobs`. Deleting a running job cancels its Triton request: the model drops the clip at its
next step and its slot goes to the next request.
"""
from __future__ import annotations

import asyncio
import time
import uuid
from dataclasses import dataclass, field

from fastapi import APIRouter, Request
from fastapi.responses import Response

from triton_omni.client.openai_proxy.context import proxy_of
from triton_omni.client.openai_proxy.errors import ProxyError, bad_field, server_error
from triton_omni.client.openai_proxy.fields import INT32_MAX, Fields, json_or_form, shown
from triton_omni.client.openai_proxy.images import image_values
from triton_omni.client.tensors import first

router = APIRouter()
MAX_SECONDS = 600
MAX_LIST = 100


async def video_values(body: Fields) -> tuple[dict, float | None]:
    """The request tensors of the `video` route, and the clip's length in seconds if given."""
    values = image_values(body)
    # OpenAI sends seconds as a string ("4"); a number is fine too.
    seconds = body.number("seconds", lo=0, lo_open=True, hi=MAX_SECONDS, strings=True)
    values.update({"seconds": (None if seconds is None else float(seconds), "FP32"),
                   "num_frames": (body.number("num_frames", lo=1, hi=INT32_MAX, integer=True), "INT32"),
                   "fps": (body.number("fps", lo=1, hi=1000, integer=True), "INT32"),
                   "guidance_scale_2": (body.number("guidance_scale_2", lo=0), "FP32"),
                   "image": (await body.file_bytes("input_reference"), "BYTES")})
    return values, seconds


def progress_percent(outputs: dict) -> int | None:
    """A model's progress report (steps done, steps) as 0-99 (100 is the finished video's)."""
    progress = outputs.get("progress")
    if progress is None or progress.size != 2:
        return None
    done, total = (int(v) for v in progress.reshape(-1))
    return min(99, 100 * done // total) if total > 0 else None


@dataclass
class VideoJob:
    id: str
    model: str
    prompt: str
    seconds: str
    size: str
    created_at: int
    status: str = "queued"
    progress: int = 0
    completed_at: int | None = None
    error: dict | None = None
    video: bytes = b""
    task: asyncio.Task | None = field(default=None, repr=False)

    def public(self) -> dict:
        return {"id": self.id, "object": "video", "model": self.model, "status": self.status,
                "progress": self.progress, "created_at": self.created_at, "completed_at": self.completed_at,
                "expires_at": None, "prompt": self.prompt, "seconds": self.seconds, "size": self.size,
                "remixed_from_video_id": None, "error": self.error}


class VideoJobs:
    def __init__(self, gateway, keep: int):
        self.gateway, self.keep = gateway, keep
        self.jobs: dict[str, VideoJob] = {}

    def start(self, job: VideoJob, values: dict) -> None:
        running = sum(1 for j in self.jobs.values() if j.status in ("queued", "in_progress"))
        if running >= self.keep:
            raise ProxyError(429, f"{running} video jobs are running, the most this server keeps; retry later",
                             code="too_many_jobs", headers={"Retry-After": "30"})
        self.jobs[job.id] = job
        job.task = asyncio.get_running_loop().create_task(self._run(job, values))
        self._forget_old()

    async def _run(self, job: VideoJob, values: dict) -> None:
        job.status = "in_progress"
        try:
            async for outputs in self.gateway.stream(job.model, values):
                # progress reports while the model denoises; the video comes last
                percent = progress_percent(outputs)
                if percent is not None:
                    job.progress = max(job.progress, percent)
                job.video += first(outputs, "video", b"") or b""
            if not job.video:
                raise ProxyError(500, "the model returned no video", code="model_error")
            job.status, job.progress = "completed", 100
        except ProxyError as e:
            job.status, job.error = "failed", {"code": e.code or "model_error", "message": e.message}
        except asyncio.CancelledError:
            job.status, job.error = "failed", {"code": "cancelled", "message": "the job was deleted"}
            raise
        except Exception as e:  # noqa: BLE001 - the job fails, the proxy goes on (the detail only in the log)
            error = server_error("internal error", f"video job {job.id}", "internal_error", e)
            job.status, job.error = "failed", {"code": error.code, "message": error.message}
        finally:
            job.completed_at = int(time.time())

    def _forget_old(self) -> None:
        done = [j for j in self.jobs.values() if j.status in ("completed", "failed")]
        for job in sorted(done, key=lambda j: j.created_at)[:max(0, len(self.jobs) - self.keep)]:
            del self.jobs[job.id]

    def get(self, video_id: str) -> VideoJob:
        job = self.jobs.get(video_id)
        if job is None:
            raise ProxyError(404, f"no video {shown(video_id)}", param="video_id", code="video_not_found")
        return job


@router.post("/v1/videos/generations")
async def generate_video(request: Request):
    """The synchronous variant: the MP4 in the response, once the model has made it (a client that
    goes away cancels the request)."""
    proxy = proxy_of(request)
    body = await json_or_form(request)
    values, _ = await video_values(body)
    model = await proxy.models.resolve("video", body.string("model"))
    video = b""
    for outputs in await proxy.gateway.collect(model.name, values, request.is_disconnected):
        video += first(outputs, "video", b"") or b""
    if not video:
        raise ProxyError(500, "the model returned no video", code="model_error")
    return Response(video, media_type="video/mp4", headers={"x-model": model.name})


@router.post("/v1/videos")
async def create_video(request: Request):
    proxy = proxy_of(request)
    body = await json_or_form(request)
    values, seconds = await video_values(body)
    model = await proxy.models.resolve("video", body.string("model"))
    job = VideoJob(f"video_{uuid.uuid4().hex}", model.name, values["prompt"][0],
                   "" if seconds is None else f"{seconds:g}", values["size"][0] or "", int(time.time()))
    proxy.videos.start(job, values)
    return job.public()


@router.get("/v1/videos")
async def list_videos(request: Request, limit: int = 20, order: str = "desc", after: str | None = None):
    if not 1 <= limit <= MAX_LIST:
        raise bad_field("limit", f"expected 1 to {MAX_LIST}, got {limit}")
    if order not in ("asc", "desc"):
        raise bad_field("order", f"expected asc or desc, got {shown(order)}")
    jobs = list(proxy_of(request).videos.jobs.values())       # in creation order
    if order == "desc":
        jobs.reverse()
    if after is not None:
        ids = [j.id for j in jobs]
        if after not in ids:
            raise ProxyError(404, f"no video {shown(after)}", param="after", code="video_not_found")
        jobs = jobs[ids.index(after) + 1:]
    page = [j.public() for j in jobs[:limit]]
    return {"object": "list", "data": page, "has_more": len(jobs) > limit,
            "first_id": page[0]["id"] if page else None, "last_id": page[-1]["id"] if page else None}


@router.get("/v1/videos/{video_id}")
async def get_video(request: Request, video_id: str):
    return proxy_of(request).videos.get(video_id).public()


@router.get("/v1/videos/{video_id}/content")
async def video_content(request: Request, video_id: str, variant: str = "video"):
    job = proxy_of(request).videos.get(video_id)
    if variant != "video":
        raise bad_field("variant", f"only 'video' is available, got {shown(variant)}")
    if job.status != "completed":
        raise ProxyError(409, f"video {video_id!r} is {job.status}; download it once completed",
                         param="video_id", code="video_not_ready")
    return Response(job.video, media_type="video/mp4")


@router.delete("/v1/videos/{video_id}")
async def delete_video(request: Request, video_id: str):
    videos = proxy_of(request).videos
    job = videos.get(video_id)
    if job.task is not None and not job.task.done():
        job.task.cancel()         # closes its Triton stream with cancel_requests=True
    del videos.jobs[job.id]
    return {"id": job.id, "object": "video.deleted", "deleted": True}
