"""/v1/videos: an asynchronous job per video, polled and downloaded as OpenAI's API does it.

    POST /v1/videos                 -> a `video` object, status "queued"
    GET  /v1/videos/{id}            -> the same object: "in_progress", then "completed" or "failed"
    GET  /v1/videos/{id}/content    -> the MP4 (409 until completed)
    GET  /v1/videos, DELETE /v1/videos/{id}

Jobs run as tasks of the proxy's event loop and keep their MP4 in memory; the oldest finished jobs
are dropped past `max_video_jobs`. Deleting a running job cancels its Triton request.
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
from triton_omni.client.openai_proxy.fields import json_or_form, shown
from triton_omni.client.openai_proxy.images import image_values
from triton_omni.client.tensors import first

router = APIRouter()
MAX_SECONDS = 600


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
                # A model may report progress (0..1) in intermediate responses; the video comes last.
                if "progress" in outputs:
                    job.progress = max(job.progress, min(99, int(100 * float(first(outputs, "progress", 0)))))
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


@router.post("/v1/videos")
async def create_video(request: Request):
    proxy = proxy_of(request)
    body = await json_or_form(request)
    values = image_values(body)
    # OpenAI sends seconds as a string ("4"); a number is fine too.
    seconds = body.number("seconds", lo=0, lo_open=True, hi=MAX_SECONDS, strings=True)
    values["seconds"] = (None if seconds is None else float(seconds), "FP32")
    values["image"] = (await body.file_bytes("input_reference"), "BYTES")
    model = await proxy.models.resolve("video", body.string("model"))
    job = VideoJob(f"video_{uuid.uuid4().hex}", model.name, values["prompt"][0],
                   "" if seconds is None else f"{seconds:g}", values["size"][0] or "", int(time.time()))
    proxy.videos.start(job, values)
    return job.public()


@router.get("/v1/videos")
async def list_videos(request: Request):
    jobs = sorted(proxy_of(request).videos.jobs.values(), key=lambda j: j.created_at, reverse=True)
    return {"object": "list", "data": [j.public() for j in jobs], "has_more": False}


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
