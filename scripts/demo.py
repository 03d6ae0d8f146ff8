"""The embedded demo: tiny random checkpoints -> model repository -> real tritonserver -> a streamed
chat answer, a speech file, an image and a short video (MP4), written to outputs/. The weights are
random: the text is gibberish, the speech is noise, the image and the video are patterns, by design;
what the demo shows is the serving path, end to end."""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

from triton_omni.client.chat import ChatClient
from triton_omni.client.image import ImageClient
from triton_omni.client.speech import SpeechClient
from triton_omni.client.video import VideoClient
from triton_omni.converters.__main__ import load_configs
from triton_omni.converters.generate import write_repository
from triton_omni.converters.tiny import build as build_tiny
from triton_omni.launcher.triton import TritonServer
from triton_omni.launcher.triton import has_gpu


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--chat-model", default="qwen3_chat",
                    choices=["qwen3_chat", "qwen3_5_chat", "qwen3_moe_chat", "qwen3_5_moe_chat"])
    ap.add_argument("--speech-model", default="orpheus_tts")
    ap.add_argument("--image-model", default="z_image_turbo", choices=["z_image_turbo", "flux2_klein"])
    ap.add_argument("--video-model", default="wan2_2_ti2v", choices=["wan2_2_ti2v", "wan2_2_t2v_a14b"])
    ap.add_argument("--prompt", default="Write a haiku about a server that never sleeps.")
    args = ap.parse_args()
    out = ROOT / "outputs"
    out.mkdir(exist_ok=True)

    t0 = time.monotonic()
    print("[demo] building tiny random checkpoints in checkpoints/tiny (random weights: expect gibberish)")
    build_tiny(ROOT / "checkpoints" / "tiny")
    target = "gpu" if has_gpu() else "cpu"
    repo = ROOT / "model_repository" if target == "cpu" else out / "model_repository_gpu"
    write_repository(load_configs(None, [], []), repo, target)
    models = [args.chat_model, args.speech_model, args.image_model, args.video_model]
    print(f"[demo] model repository: {repo} (target {target}); serving {', '.join(models)}")
    with TritonServer(repo, models=models, log_path=out / "tritonserver.log") as server:
        print(f"[demo] tritonserver ready in {time.monotonic() - t0:.1f} s "
              f"(gRPC {server.grpc_url}, HTTP {server.http_url}; log: outputs/tritonserver.log)")

        print(f"[demo] user: {args.prompt}\n[demo] assistant (streamed): ", end="", flush=True)
        text, last, start = [], None, time.monotonic()
        for chunk in ChatClient(server.grpc_url).stream(args.chat_model, messages=[{"role": "user", "content": args.prompt}],
                                                        sampling={"max_tokens": 48, "temperature": 0.8, "seed": 7}):
            print(chunk.text, end="", flush=True)
            text.append(chunk.text)
            last = chunk
        print(f"\n[demo] finish_reason={last.finish_reason} completion_tokens={last.completion_tokens} "
              f"in {time.monotonic() - start:.2f} s")
        (out / "chat.txt").write_text(f"user: {args.prompt}\nassistant: {''.join(text)}\n")

        start = time.monotonic()
        speech = SpeechClient(server.grpc_url).synthesize(args.speech_model, "Hello from Triton.", voice="tara",
                                                           response_format="wav", sampling={"seed": 7, "max_tokens": 70})
        (out / "speech.wav").write_bytes(speech.audio)
        print(f"[demo] speech: outputs/speech.wav ({len(speech.audio)} bytes, {speech.sample_rate} Hz) "
              f"in {time.monotonic() - start:.2f} s")

        start = time.monotonic()
        images = ImageClient(server.grpc_url).generate(args.image_model, "a lighthouse at dawn", size="256x256",
                                                       num_inference_steps=4, seed=7)
        (out / "image.png").write_bytes(images[0])
        print(f"[demo] image: outputs/image.png ({len(images[0])} bytes) in {time.monotonic() - start:.2f} s")

        start = time.monotonic()
        steps = []
        video = VideoClient(server.grpc_url).generate(args.video_model, "waves at dusk", size="128x64", num_frames=17,
                                                      fps=8, num_inference_steps=4, seed=7,
                                                      on_progress=lambda done, total: steps.append(done))
        (out / "video.mp4").write_bytes(video)
        print(f"[demo] video: outputs/video.mp4 ({len(video)} bytes, 17 frames at 8 fps, progress {steps}) "
              f"in {time.monotonic() - start:.2f} s")
    print("[demo] wrote outputs/chat.txt, outputs/speech.wav, outputs/image.png, outputs/video.mp4; server stopped")
    return 0


if __name__ == "__main__":
    sys.exit(main())
