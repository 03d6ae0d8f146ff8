"""Cosmos3 text to video on a live tritonserver, through its front: an MP4 that PyAV decodes to the
requested frames, size and fps and to the reference pipeline's frames; progress in order before the
video; bad input refused as INVALID_ARG naming the field while a neighbour completes; the OpenAI
proxy's /v1/videos serving it (the `video` route, as for Wan)."""
from __future__ import annotations

import json
import re
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import torch

from tests.conftest import running_server
from triton_omni.client.triton import responses
from triton_omni.client.video import VideoClient, video_values
from triton_omni.media.video import decode_video, encode_mp4

pytestmark = pytest.mark.server
MODEL = "cosmos3_t2v"
SMALL = dict(size="64x32", num_frames=9, fps=8, num_inference_steps=4, seed=3)


@pytest.fixture(scope="module")
def server(tmp_path_factory, tiny_checkpoints):
    # lossless H.264 (crf 0: only 4:2:0 chroma loses anything, the same for every frame)
    with running_server(tmp_path_factory.mktemp("cosmos3"), [MODEL], [f"{MODEL}.encode.crf=0"]) as s:
        yield s


def stream(server, prompt: str, **kwargs) -> list[dict]:
    return list(responses(server.grpc_url, MODEL, video_values(prompt, **kwargs), timeout_s=120))


def test_t2v_mp4_decodes_to_the_request_and_the_reference(server, tiny_checkpoints):
    from diffusers import Cosmos3OmniPipeline
    from transformers import AutoTokenizer

    from triton_omni.diffusion.checkpoint import load_component, load_scheduler

    data = VideoClient(server.grpc_url, timeout_s=120).generate(MODEL, "a red fox", negative_prompt="blurry", **SMALL)
    video = decode_video(data)
    assert (video.codec, video.pix_fmt, video.fps) == ("h264", "yuv420p", 8.0)
    assert video.frames.shape == (9, 32, 64, 3)
    folder = tiny_checkpoints[MODEL]
    pipe = Cosmos3OmniPipeline(transformer=load_component(folder, "transformer"), vae=load_component(folder, "vae"),
                               scheduler=load_scheduler(folder), enable_safety_checker=False,
                               text_tokenizer=AutoTokenizer.from_pretrained(str(folder / "text_tokenizer")))
    pipe.set_progress_bar_config(disable=True)
    want = pipe(prompt="a red fox", negative_prompt="blurry", width=64, height=32, num_frames=9, fps=8.0,
                num_inference_steps=4, generator=torch.Generator().manual_seed(3), output_type="np").video
    # the reference's frames after the same encoding: the two then differ where the frames did (a level)
    want = decode_video(encode_mp4((want * 255).round().astype(np.uint8), fps=8, crf=0)).frames
    diff = np.abs(video.frames.astype(int) - want)
    assert diff.mean() < 0.1 and diff.max() <= 3, (diff.mean(), diff.max())


def test_progress_arrives_in_order_and_ends_with_the_video(server):
    replies = stream(server, "waves at dusk", **{**SMALL, "num_inference_steps": 6})
    progress = [tuple(r["progress"].reshape(-1)) for r in replies if "progress" in r]
    assert progress == [(i, 6) for i in range(1, 7)]
    assert "video" in replies[-1] and all("video" not in r for r in replies[:-1])
    assert decode_video(bytes(replies[-1]["video"].reshape(-1)[0])).frames.shape == (9, 32, 64, 3)


BAD = [
    ({"num_frames": 0}, "num_frames"),
    ({"num_frames": 10}, "num_frames"),
    ({"size": "40x32"}, "size"),           # the VAE takes multiples of 16
    ({"fps": -1}, "fps"),
]


def test_bad_input_is_invalid_arg_naming_the_field_while_a_neighbour_completes(server):
    # a gRPC stream's error carries no status code; its text tells: the front's InvalidInput (INVALID_ARG)
    # reads "field 'NAME': ...", a server fault "TypeName: ..." with a traceback
    with ThreadPoolExecutor(len(BAD) + 1) as pool:
        neighbour = pool.submit(stream, server, "a calm lake", **{**SMALL, "num_inference_steps": 8})
        bad = [pool.submit(stream, server, "a calm lake", **{**SMALL, **change}) for change, _ in BAD]
        for future, (change, field) in zip(bad, BAD):
            with pytest.raises(Exception) as err:
                future.result(timeout=120)
            text = str(err.value)
            assert re.search(rf"(^|, )field '{field}': ", text) and "Traceback" not in text, (change, text)
        replies = neighbour.result(timeout=120)
    assert decode_video(bytes(replies[-1]["video"].reshape(-1)[0])).frames.shape == (9, 32, 64, 3)


# -- the OpenAI-compatible proxy's /v1/videos -------------------------------------------------------
@pytest.fixture(scope="module")
def proxy(server, tmp_path_factory):
    from tests.test_openai_proxy import running_proxy

    with running_proxy(server.grpc_url, tmp_path_factory.mktemp("cosmos3_proxy") / "proxy.log") as url:
        yield url


def post(url: str, body: dict):
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    return urllib.request.urlopen(req, timeout=120)


def test_the_proxy_serves_video_jobs_and_the_synchronous_route(proxy):
    job = json.loads(post(f"{proxy}/v1/videos", {"model": MODEL, "prompt": "waves at dusk", "size": "64x32",
                                                 "num_frames": 5, "fps": 8, "num_inference_steps": 3}).read())
    deadline = time.monotonic() + 120
    while job["status"] in ("queued", "in_progress"):
        assert time.monotonic() < deadline, job
        time.sleep(0.05)
        job = json.loads(urllib.request.urlopen(f"{proxy}/v1/videos/{job['id']}", timeout=30).read())
    assert job["status"] == "completed" and job["progress"] == 100, job
    content = urllib.request.urlopen(f"{proxy}/v1/videos/{job['id']}/content", timeout=30).read()
    video = decode_video(content)
    assert video.frames.shape == (5, 32, 64, 3) and video.fps == 8.0
    # a size the VAE cannot take fails the job with the model's message naming the field
    bad = json.loads(post(f"{proxy}/v1/videos", {"model": MODEL, "prompt": "a fox", "size": "40x32"}).read())
    while bad["status"] in ("queued", "in_progress"):
        assert time.monotonic() < deadline, bad
        time.sleep(0.05)
        bad = json.loads(urllib.request.urlopen(f"{proxy}/v1/videos/{bad['id']}", timeout=30).read())
    assert bad["status"] == "failed" and "field 'size'" in bad["error"]["message"], bad
    with post(f"{proxy}/v1/videos/generations", {"model": MODEL, "prompt": "a lighthouse", "size": "64x32",
                                                  "num_frames": 5, "num_inference_steps": 2, "fps": 10}) as resp:
        assert resp.headers["Content-Type"] == "video/mp4"
        assert decode_video(resp.read()).frames.shape == (5, 32, 64, 3)
