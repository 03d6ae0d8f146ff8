"""Wan2.2 TI2V-5B (text to video and text + first frame to video) on a live tritonserver, through
its front: MP4s that PyAV decodes to the requested frames, size and fps and to the reference
pipeline's frames; progress in order before the video; concurrent clips sharing the denoise loop's
model calls; bad input refused by name while a neighbour completes; a cancelled clip's slot reused.
"""
from __future__ import annotations

import io
import re
import threading
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import torch
from PIL import Image

from triton_omni.client.triton import responses
from triton_omni.client.video import VideoClient, video_values
from triton_omni.media.video import decode_video, encode_mp4
from tests.conftest import running_server

pytestmark = pytest.mark.server
MODEL = "wan2_2_ti2v"
SMALL = dict(size="64x32", num_frames=9, fps=8, num_inference_steps=4, seed=3)


def png(width: int, height: int, seed: int = 0) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(np.random.default_rng(seed).integers(0, 256, (height, width, 3), dtype=np.uint8)).save(buf, "PNG")
    return buf.getvalue()


@pytest.fixture(scope="module")
def server(tmp_path_factory, tiny_checkpoints):
    # max_steps 2000: a long clip that costs little (the cancellation test's); lossless
    # H.264 (crf 0: only 4:2:0 chroma loses anything, the same for every frame)
    with running_server(tmp_path_factory.mktemp("video"), [MODEL],
                        [f"{MODEL}.max_steps=2000", f"{MODEL}.encode.crf=0"]) as s:
        yield s


def stream(server, prompt: str, **kwargs) -> list[dict]:
    return list(responses(server.grpc_url, MODEL, video_values(prompt, **kwargs), timeout_s=120))


def metric(server, name: str) -> float:
    text = urllib.request.urlopen(f"http://127.0.0.1:{server.metrics_port}/metrics", timeout=5).read().decode()
    m = re.search(rf'^triton_omni_video_{name}{{model="{MODEL}_denoise"}} ([0-9.e+]+)$', text, re.M)
    assert m, f"triton_omni_video_{name} not in /metrics"
    return float(m.group(1))


def settled_metric(server, name: str, want) -> float:
    """The gauge once it reads `want` (published every 0.1 s), or its last value after 5 s."""
    deadline = time.monotonic() + 5
    while (value := metric(server, name)) != want and time.monotonic() < deadline:
        time.sleep(0.1)
    return value


def test_t2v_and_i2v_mp4s_decode_to_the_request_and_the_reference(server, tiny_checkpoints):
    from diffusers import WanImageToVideoPipeline, WanPipeline

    from triton_omni.diffusion.checkpoint import load_component

    image = png(48, 24, 1)
    for first_frame in (None, image):
        data = VideoClient(server.grpc_url, timeout_s=120).generate(MODEL, "a red fox", image=first_frame, **SMALL)
        video = decode_video(data)
        assert (video.codec, video.pix_fmt, video.fps) == ("h264", "yuv420p", 8.0)
        assert video.frames.shape == (9, 32, 64, 3)
        folder = tiny_checkpoints[MODEL]
        cls = WanImageToVideoPipeline if first_frame else WanPipeline
        pipe = cls.from_pretrained(str(folder), transformer=load_component(folder, "transformer"))
        pipe.set_progress_bar_config(disable=True)
        extra = {"image": Image.open(io.BytesIO(image)).convert("RGB")} if first_frame else {}
        want = pipe(prompt="a red fox", width=64, height=32, num_frames=9, num_inference_steps=4,
                    generator=torch.Generator().manual_seed(3), output_type="np", **extra).frames[0]
        # 4:2:0 chroma loses much of the tiny model's pixel noise, so the reference's frames are compared
        # after the same encoding: then the two differ where the frames did (by a level, here and there)
        want = decode_video(encode_mp4((want * 255).round().astype(np.uint8), fps=8, crf=0)).frames
        diff = np.abs(video.frames.astype(int) - want)
        assert diff.mean() < 0.1 and diff.max() <= 3, (diff.mean(), diff.max())


def test_progress_arrives_in_order_and_ends_with_the_video(server):
    replies = stream(server, "waves at dusk", **{**SMALL, "num_inference_steps": 6})
    progress = [tuple(r["progress"].reshape(-1)) for r in replies if "progress" in r]
    assert progress == [(i, 6) for i in range(1, 7)]
    assert "video" in replies[-1] and all("video" not in r for r in replies[:-1])
    assert decode_video(bytes(replies[-1]["video"].reshape(-1)[0])).frames.shape[0] == 9


def test_concurrent_clips_share_the_denoise_model_calls(server):
    prompts = [("sun", 1), ("moon", 2)]
    kw = {**SMALL, "num_inference_steps": 20}
    def run(p):
        return VideoClient(server.grpc_url, timeout_s=120).generate(MODEL, p[0], **{**kw, "seed": p[1]})
    alone = [decode_video(run(p)).frames for p in prompts]
    for _ in range(3):          # timing: on a loaded machine the second may reach the loop after the first ended
        calls, finished = metric(server, "model_calls"), metric(server, "clips_finished")
        with ThreadPoolExecutor(2) as pool:
            together = [decode_video(v).frames for v in pool.map(run, prompts)]
        settled_metric(server, "clips_finished", finished + 2)
        shared = 40 - (metric(server, "model_calls") - calls)        # steps that ran in one call for both
        for a, t in zip(alone, together):
            assert np.abs(a.astype(int) - t.astype(int)).max() <= 2
        if shared > 0:
            break
    assert shared > 0 and metric(server, "max_call_clips") >= 2


BAD = [
    ({"num_frames": 0}, "field 'num_frames'"),
    ({"num_frames": 125}, "field 'num_frames'"),
    ({"num_frames": 10}, "1 + a multiple of 4"),
    ({"size": "48x32"}, "multiples of 32"),
    ({"image": b"\x89PNG\r\n\x1a\n broken"}, "field 'image'"),
    ({"fps": -1}, "field 'fps'"),
]


def test_bad_input_fails_that_request_only(server):
    with ThreadPoolExecutor(len(BAD) + 1) as pool:
        neighbour = pool.submit(stream, server, "a calm lake", **{**SMALL, "num_inference_steps": 8})
        bad = [pool.submit(stream, server, "a calm lake", **{**SMALL, **change}) for change, _ in BAD]
        for future, (change, message) in zip(bad, BAD):
            with pytest.raises(Exception) as err:
                future.result(timeout=120)
            assert message in str(err.value) and "Traceback" not in str(err.value), (change, str(err.value))
        replies = neighbour.result(timeout=120)
    assert decode_video(bytes(replies[-1]["video"].reshape(-1)[0])).frames.shape == (9, 32, 64, 3)


def test_a_cancelled_clip_frees_its_slot(server):
    """Two long clips fill the loop's two slots; a third waits. Cancelling one long clip lets the third
    run and finish while the other long clip still runs."""
    cancelled, long_started = metric(server, "clips_cancelled"), threading.Barrier(3)
    stop_other = threading.Event()

    def long_clip(cancel_after_first: bool):
        for outputs in responses(server.grpc_url, MODEL, video_values("slow", **{**SMALL, "num_inference_steps": 2000}),
                                 timeout_s=120):
            if "progress" in outputs and outputs["progress"].reshape(-1)[0] == 1:
                long_started.wait(30)
            if cancel_after_first or stop_other.is_set():
                return outputs["progress"].reshape(-1)[0]     # leaving the stream cancels the request
        return None

    with ThreadPoolExecutor(2) as pool:
        first, second = pool.submit(long_clip, True), pool.submit(long_clip, False)
        long_started.wait(60)
        quick = stream(server, "quick", **SMALL)            # waits for a slot; gets the cancelled clip's
        other_still_running = not second.done()
        stop_other.set()
        assert first.result(60) is not None and second.result(60) is not None
    assert decode_video(bytes(quick[-1]["video"].reshape(-1)[0])).frames.shape[0] == 9
    assert other_still_running, "the third clip got no slot before a long clip ended"
    assert settled_metric(server, "clips_cancelled", cancelled + 2) == cancelled + 2
    assert settled_metric(server, "active_clips", 0) == 0


def test_the_cli_draws_progress_and_writes_the_mp4(server, tmp_path):
    import subprocess
    import sys

    from tests.conftest import ROOT

    out = tmp_path / "clips" / "waves.mp4"
    run = subprocess.run([sys.executable, "-m", "triton_omni.client", "video", "--url", server.grpc_url, "--model", MODEL,
                          "waves at dusk", "--size", "64x32", "--frames", "5", "--fps", "8", "--steps", "10",
                          "-o", str(out)], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    assert "10/10 steps" in run.stderr and f"wrote {out}" in run.stderr, run.stderr   # a log line per tenth
    assert decode_video(out.read_bytes()).frames.shape == (5, 32, 64, 3)
    bad = subprocess.run([sys.executable, "-m", "triton_omni.client", "video", "--url", server.grpc_url, "--model",
                          MODEL, "x", "--size", "64x32", "--frames", "6"], cwd=ROOT, capture_output=True, text=True,
                         timeout=120)
    assert bad.returncode == 1 and "field 'num_frames'" in bad.stderr and len(bad.stderr.splitlines()) == 1


# -- the OpenAI-compatible proxy's /v1/videos, with the openai SDK -----------------------------------
@pytest.fixture(scope="module")
def sdk(server, tmp_path_factory):
    import openai

    from tests.test_openai_proxy import running_proxy

    with running_proxy(server.grpc_url, tmp_path_factory.mktemp("video_proxy") / "proxy.log") as url:
        client = openai.OpenAI(api_key="unused", base_url=f"{url}/v1", max_retries=0, timeout=120)
        client.proxy_url = url
        yield client
        client.close()


def wait_done(sdk, video_id: str, seen: list[int] | None = None):
    deadline = time.monotonic() + 120
    while (job := sdk.videos.retrieve(video_id)).status in ("queued", "in_progress"):
        assert time.monotonic() < deadline, job
        if seen is not None:
            seen.append(job.progress)
        time.sleep(0.02)
    return job


@pytest.mark.filterwarnings("ignore:The Sora API")
def test_video_jobs_with_the_openai_sdk(server, sdk):
    import openai

    job = sdk.videos.create(model=MODEL, prompt="waves at dusk", size="64x32",
                            extra_body={"num_frames": 9, "fps": 8, "num_inference_steps": 40, "seed": 4})
    assert job.object == "video" and job.model == MODEL and job.status in ("queued", "in_progress")
    seen: list[int] = []
    job = wait_done(sdk, job.id, seen)
    assert job.status == "completed" and job.progress == 100 and job.size == "64x32"
    assert seen == sorted(seen) and any(0 < p < 100 for p in seen), seen     # progress while it denoised
    assert job.id in [v.id for v in sdk.videos.list()]
    video = decode_video(sdk.videos.download_content(job.id).content)
    assert video.frames.shape == (9, 32, 64, 3) and video.fps == 8.0
    assert sdk.videos.delete(job.id).deleted
    with pytest.raises(openai.NotFoundError):
        sdk.videos.retrieve(job.id)
    # the first frame as input_reference (multipart); a bad field fails the job with the model's message
    job = wait_done(sdk, sdk.videos.create(model=MODEL, prompt="a fox", size="64x32",
                                           input_reference=("first.png", png(64, 32, 5), "image/png"),
                                           extra_body={"num_frames": 5, "num_inference_steps": 2}).id)
    assert job.status == "completed"
    assert decode_video(sdk.videos.download_content(job.id).content).frames.shape == (5, 32, 64, 3)
    job = wait_done(sdk, sdk.videos.create(model=MODEL, prompt="a fox", size="48x32").id)
    assert job.status == "failed" and "multiples of 32" in job.error.message


@pytest.mark.filterwarnings("ignore:The Sora API")
def test_deleting_a_running_job_cancels_its_clip(server, sdk):
    cancelled = metric(server, "clips_cancelled")
    job = sdk.videos.create(model=MODEL, prompt="slow", size="64x32", extra_body={"num_frames": 5,
                                                                                 "num_inference_steps": 2000})
    deadline = time.monotonic() + 60
    while sdk.videos.retrieve(job.id).progress == 0:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    assert sdk.videos.delete(job.id).deleted
    assert settled_metric(server, "clips_cancelled", cancelled + 1) == cancelled + 1
    assert settled_metric(server, "active_clips", 0) == 0


def test_the_synchronous_route_answers_with_the_mp4(sdk):
    import json

    body = json.dumps({"model": MODEL, "prompt": "a lighthouse", "size": "64x32", "num_frames": 5,
                       "num_inference_steps": 2, "fps": 10}).encode()
    req = urllib.request.Request(f"{sdk.proxy_url}/v1/videos/generations", data=body,
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as resp:
        assert resp.headers["Content-Type"] == "video/mp4"
        video = decode_video(resp.read())
    assert video.frames.shape == (5, 32, 64, 3) and video.fps == 10.0
