"""The vision models on one live tritonserver, over gRPC and through the OpenAI proxy with the `openai` SDK:
image and video questions answered as transformers answers them, eight requests of different image
sizes through one vision tower execution, video and text embeddings, and bad media refused by name
without harm to the requests beside them."""
from __future__ import annotations

import base64
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import openai
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from triton_omni.client.chat import ChatClient
from triton_omni.client.embed import EmbedClient
from triton_omni.client.tensors import make_inputs
from tests import vision_cases as vc
from tests.conftest import running_server, step_counts
from tests.test_openai_proxy import running_proxy

pytestmark = pytest.mark.server
MODEL, VISION = "qwen3_5_vl_chat", "qwen3_5_vl_chat_vision"
UPLOAD_PIXELS = 200 * 200          # lowered for the test: a 300x300 upload is over it


@pytest.fixture(scope="module")
def server(tmp_path_factory, tiny_checkpoints):
    # the vision step waits up to 0.3 s for a batch: requests sent together share one tower call
    overrides = [f"{MODEL}.vision.max_queue_delay_us=300000", f"{MODEL}.pre.max_upload_pixels={UPLOAD_PIXELS}",
                 f"{MODEL}.ar.max_num_seqs=8"]
    with running_server(tmp_path_factory.mktemp("vision"), [MODEL, "vjepa2_embed", "qwen3_embed"], overrides) as s:
        yield s


@pytest.fixture(scope="module")
def sdk(server, tmp_path_factory):
    with running_proxy(server.grpc_url, tmp_path_factory.mktemp("vision_proxy") / "proxy.log") as url:
        client = openai.OpenAI(api_key="unused", base_url=f"{url}/v1", max_retries=0, timeout=120)
        yield client
        client.close()


@pytest.fixture(scope="module")
def reference(tiny_checkpoints):
    """transformers' greedy answer (text) to a question with images or videos, on our pre step's prompt."""
    from transformers import AutoTokenizer, Qwen3_5ForConditionalGeneration

    folder = tiny_checkpoints["qwen3_5_vl"]
    steps = vc.load_steps(MODEL, ["pre", "vision"])
    hf, tok = Qwen3_5ForConditionalGeneration.from_pretrained(folder).eval(), AutoTokenizer.from_pretrained(folder)

    def answer(parts, images=(), videos=(), n=vc.GREEDY["max_tokens"]) -> str:
        (out,) = steps["pre"].execute([vc.pre_request(vc.user(parts), images, videos, dict(vc.GREEDY, max_tokens=n))])
        return tok.decode(vc.hf_greedy(hf, out, steps["vision"].tower, n), skip_special_tokens=True)

    return answer


def ask(server, parts, images=(), videos=(), sampling=vc.GREEDY, **kw):
    chunks = list(ChatClient(server.grpc_url, timeout_s=120).stream(
        MODEL, messages=vc.user(parts), sampling=sampling, images=list(images), videos=list(videos), **kw))
    return "".join(c.text for c in chunks), chunks


def test_an_image_question_streams_the_reference_answer(server, reference):
    png, n = vc.image(70, 100), 32         # enough tokens that the stream cannot come as one response
    text, chunks = ask(server, vc.IMAGE_Q, images=[png], sampling=dict(vc.GREEDY, max_tokens=n))
    assert len(chunks) > 1 and chunks[-1].completion_tokens == n
    assert text == reference(vc.IMAGE_Q, images=[png], n=n)


def test_a_video_question_gets_the_reference_answer(server, reference):
    mp4 = vc.video()
    text, chunks = ask(server, vc.VIDEO_Q, videos=[mp4])
    assert text == reference(vc.VIDEO_Q, videos=[mp4])
    # the prompt: 3 temporal patches of 2x2 merged patches, each with its timestamp text
    assert chunks[-1].prompt_tokens > 3 * 4


def test_eight_image_sizes_share_one_tower_execution_and_answer_as_alone(server):
    pictures = [vc.image(h, w, seed=i) for i, (h, w) in enumerate(vc.IMAGE_SIZES)]
    alone = [ask(server, vc.IMAGE_Q, images=[p])[0] for p in pictures]
    rounds = []
    for _ in range(3):              # dynamic batching is timing: on a loaded machine a round may split
        before = step_counts(server, VISION)
        with ThreadPoolExecutor(len(pictures)) as pool:
            together = list(pool.map(lambda p: ask(server, vc.IMAGE_Q, images=[p])[0], pictures))
        after = step_counts(server, VISION)
        rounds.append((after[0] - before[0], after[1] - before[1]))
        assert together == alone
        if rounds[-1][1] == 1:
            break
    assert rounds[-1] == (8, 1), f"(inferences, executions) of the vision step per round: {rounds}"


def test_openai_sdk_chat_with_an_image(server, sdk):
    png = vc.image(48, 48, seed=3)
    url = "data:image/png;base64," + base64.b64encode(png).decode()
    messages = vc.user([{"type": "image_url", "image_url": {"url": url}}, {"type": "text", "text": "Describe the image."}])
    direct, _ = ask(server, vc.IMAGE_Q, images=[png])
    r = sdk.chat.completions.create(model=MODEL, messages=messages, temperature=0, max_tokens=vc.GREEDY["max_tokens"],
                                    extra_body={"ignore_eos": True})
    assert r.choices[0].message.content == direct and r.usage.completion_tokens == vc.GREEDY["max_tokens"]
    stream = sdk.chat.completions.create(model=MODEL, messages=messages, temperature=0, stream=True,
                                         max_tokens=vc.GREEDY["max_tokens"], extra_body={"ignore_eos": True})
    assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices) == direct


def test_openai_sdk_embeddings_of_videos_and_texts(server, sdk):
    clips = [vc.video(frames=8, h=48, w=64, fps=4, seed=5), vc.video(frames=4, h=40, w=40, fps=4, seed=6)]
    direct = [EmbedClient(server.grpc_url).video("vjepa2_embed", c, num_frames=8) for c in clips]
    urls = ["data:video/mp4;base64," + base64.b64encode(c).decode() for c in clips]
    r = sdk.embeddings.create(model="vjepa2_embed", input=urls, extra_body={"num_frames": 8})     # base64 floats
    assert [d.index for d in r.data] == [0, 1]
    for d, (pooled, _) in zip(r.data, direct):
        np.testing.assert_allclose(d.embedding, pooled, rtol=1e-6)
    raw = sdk.embeddings.with_raw_response.create(
        model="vjepa2_embed", input=[{"type": "video_url", "video_url": {"url": urls[1]}}], encoding_format="float",
        extra_body={"num_frames": 8, "patch_embeddings": True}).http_response.json()
    np.testing.assert_allclose(raw["data"][0]["patch_embeddings"], direct[1][1], rtol=1e-6)
    texts = ["Triton serves models", "a robot learns to paint"]
    r = sdk.embeddings.create(model="qwen3_embed", input=texts)
    for d, t in zip(r.data, texts):
        # batched with the other text (left padding) against alone: equal up to float rounding
        np.testing.assert_allclose(d.embedding, EmbedClient(server.grpc_url).text("qwen3_embed", t), atol=1e-5)
        assert abs(np.linalg.norm(d.embedding) - 1) < 1e-5
    assert r.usage.prompt_tokens > len(texts)
    with pytest.raises(openai.BadRequestError) as err:
        sdk.embeddings.create(model="qwen3_embed", input=[[1, 2, 3]])
    assert err.value.body["param"] == "input[0]"
    with pytest.raises(openai.BadRequestError) as err:
        sdk.embeddings.create(model="vjepa2_embed", input=["data:video/mp4;base64," + base64.b64encode(b"junk").decode()])
    assert err.value.body["param"] == "input[0]" and "not a recognised video" in err.value.body["message"]


def _good_neighbour(server):
    return ask(server, vc.IMAGE_Q, images=[vc.image(64, 40, seed=9)])


BAD = [
    ("corrupt image", dict(parts=vc.IMAGE_Q, images=[b"\x89PNG\r\n\x1a\n" + b"\x00" * 40]), "images[0]"),
    ("zero-length video", dict(parts=vc.VIDEO_Q, videos=[b""]), "videos[0]"),
    ("undecodable video", dict(parts=vc.VIDEO_Q, videos=[b"\x00\x00\x00\x18ftypmp42" + b"\x07" * 300]), "videos[0]"),
    ("image over the pixel budget", dict(parts=vc.IMAGE_Q, images=[vc.image(300, 300)]), "images[0]"),
    ("unsupported content part", dict(parts=[{"type": "input_audio", "input_audio": {"data": "", "format": "wav"}}]),
     "messages[0].content[0]"),
    ("more images than allowed", dict(parts=[{"type": "image"}] * 9, images=[vc.image(32, 32)] * 9), "images"),
]


@pytest.mark.parametrize("case,request_,field", BAD, ids=[b[0] for b in BAD])
def test_bad_media_is_refused_by_name_and_spares_its_neighbour(server, case, request_, field):
    with ThreadPoolExecutor(2) as pool:
        good = pool.submit(_good_neighbour, server)
        with pytest.raises(InferenceServerException) as err:
            ask(server, request_["parts"], request_.get("images", ()), request_.get("videos", ()))
        text, chunks = good.result(timeout=120)
    assert f"field '{field}'" in err.value.message(), err.value.message()
    assert chunks[-1].completion_tokens == vc.GREEDY["max_tokens"]          # the neighbour was not harmed


def test_the_pre_step_answers_invalid_arg(server):
    """Called directly (no stream), the refusal is gRPC INVALID_ARGUMENT naming the field, at once."""
    client = grpcclient.InferenceServerClient(server.grpc_url)
    values = {"messages": (vc.user(vc.IMAGE_Q), "BYTES"), "images": ([b"not an image"], "BYTES")}
    start = time.monotonic()
    try:
        with pytest.raises(InferenceServerException) as err:
            client.infer(f"{MODEL}_pre", make_inputs(grpcclient, values), client_timeout=60)
    finally:
        client.close()
    assert err.value.status() == "StatusCode.INVALID_ARGUMENT" and "field 'images[0]'" in err.value.message()
    assert time.monotonic() - start < 10


def test_the_proxy_refuses_what_the_model_cannot_take(sdk):
    cases = [([{"type": "input_audio", "input_audio": {"data": "", "format": "wav"}}], "messages[0].content[0]"),
             ([{"type": "image_url", "image_url": {"url": "https://example.com/cat.png"}}], "messages[0].content[0]"),
             ([{"type": "image_url", "image_url": {"url": "data:image/png;base64,%%%"}}], "messages[0].content[0]")]
    for parts, param in cases:
        with pytest.raises(openai.BadRequestError) as err:
            sdk.chat.completions.create(model=MODEL, messages=vc.user(parts), max_tokens=4)
        assert err.value.body["param"] == param, err.value.body
    png = "data:image/png;base64," + base64.b64encode(vc.image(300, 300)).decode()
    with pytest.raises(openai.BadRequestError) as err:
        sdk.chat.completions.create(model=MODEL, max_tokens=4,
                                    messages=vc.user([{"type": "image_url", "image_url": {"url": png}}]))
    assert "images[0]" in err.value.body["message"] and "pixels" in err.value.body["message"]


def test_the_cli_asks_about_an_image_and_embeds_a_video(server, tmp_path):
    import subprocess
    import sys

    from tests.conftest import ROOT

    png, mp4 = tmp_path / "in.png", tmp_path / "clip.mp4"
    png.write_bytes(vc.image(48, 64, seed=11))
    mp4.write_bytes(vc.video(frames=4, fps=4, seed=12))

    def cli(*args):
        run = subprocess.run([sys.executable, "-m", "triton_omni.client", *args, "--url", server.grpc_url],
                             cwd=ROOT, capture_output=True, text=True, timeout=120)
        assert run.returncode == 0, run.stderr
        return run

    run = cli("chat", "--model", MODEL, "--image", str(png), "Describe the image.", "--max-tokens", "10",
              "--temperature", "0", "--ignore-eos")
    assert run.stdout.rstrip("\n") == ask(server, vc.IMAGE_Q, images=[png.read_bytes()])[0]
    cli("embed", "--model", "vjepa2_embed", "--video", str(mp4), "--frames", "4", "-o", str(tmp_path / "e.npy"))
    pooled, _ = EmbedClient(server.grpc_url).video("vjepa2_embed", mp4.read_bytes(), num_frames=4)
    np.testing.assert_array_equal(np.load(tmp_path / "e.npy"), pooled)
