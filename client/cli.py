"""`python -m triton_omni.client TASK ...`: one subcommand per task, outputs written to files.

    python -m triton_omni.client chat --model qwen3_chat "Write a haiku" -o answer.txt
    python -m triton_omni.client chat --model qwen3_5_vl_chat --image cat.png "What is in the picture?"
    python -m triton_omni.client chat --model qwen3_omni --audio question.wav "Answer the question."
    python -m triton_omni.client embed --model vjepa2_embed --video clip.mp4 -o clip.npy
    python -m triton_omni.client speech --model orpheus_tts "Hello there" --voice tara -o hello.wav
    python -m triton_omni.client transcribe --model omniasr_ctc speech.mp3 --format srt -o speech.srt
    python -m triton_omni.client image --model z_image_turbo "a red fox" --size 512x512 -o fox.png
    python -m triton_omni.client edit --model flux2_klein --image fox.png "make it blue" -o blue.png
    python -m triton_omni.client video --model wan2_2_ti2v "waves at dusk" --size 832x480 --frames 81 -o waves.mp4

`--url host:8001` talks gRPC (default), `--url http://host:8000` HTTP. Streamed text goes to stdout
as it arrives; progress and statistics go to stderr, so stdout stays clean for pipes.
"""
from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from contextlib import contextmanager
from pathlib import Path

from triton_omni.client.chat import ChatClient
from triton_omni.client.embed import EmbedClient
from triton_omni.client.image import ImageClient
from triton_omni.client.progress import bar, shown
from triton_omni.client.speech import FORMATS, SpeechClient
from triton_omni.client.transcribe import FORMATS as TRANSCRIPT_FORMATS, TranscribeClient
from triton_omni.client.video import VideoClient


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


@contextmanager
def progress(what: str):
    """Elapsed time (a tqdm bar, client/progress.py) while a long request runs; a log line when not
    shown (not a terminal, or CI)."""
    stop = threading.Event()
    start = time.monotonic()
    with bar(desc=f"[{what}]", unit="s", total=None) as ticks:

        def tick():
            while not stop.wait(0.5):
                ticks.update(0.5)

        ticker = threading.Thread(target=tick, daemon=True)
        if shown():
            ticker.start()
        else:
            log(f"[{what}] started")
        try:
            yield
        finally:
            stop.set()
            if ticker.is_alive():
                ticker.join()
    log(f"[{what}] done in {time.monotonic() - start:.1f} s")


def numbered(path: Path, i: int, n: int) -> Path:
    """out.png for one image; out-1.png, out-2.png, ... for several."""
    return path if n == 1 else path.with_name(f"{path.stem}-{i + 1}{path.suffix}")


def write(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    log(f"wrote {path} ({len(data)} bytes)")


# -- tasks ---------------------------------------------------------------------------------------
def chat(args) -> int:
    media = [{"type": "audio"}] * len(args.audio) + [{"type": "image"}] * len(args.image) + \
        [{"type": "video"}] * len(args.video)
    content = media + [{"type": "text", "text": args.prompt}] if media else args.prompt
    messages = ([{"role": "system", "content": args.system}] if args.system else []) + \
        [{"role": "user", "content": content}]
    sampling = {k: v for k, v in {"max_tokens": args.max_tokens, "temperature": args.temperature,
                                  "top_p": args.top_p, "seed": args.seed, "stop": args.stop or None,
                                  "ignore_eos": args.ignore_eos or None}.items() if v is not None}
    client = ChatClient(args.url, timeout_s=args.timeout)
    parts, last = [], None
    start = time.monotonic()
    for chunk in client.stream(args.model, messages=messages, sampling=sampling, stream=not args.no_stream,
                               images=[p.read_bytes() for p in args.image], videos=[p.read_bytes() for p in args.video],
                               mm_processor_kwargs={"fps": args.fps} if args.fps else None,
                               audios=[p.read_bytes() for p in args.audio]):
        print(chunk.text, end="", flush=True)
        parts.append(chunk.text)
        last = chunk
    print()
    if last is not None:
        log(f"[chat] finish_reason={last.finish_reason} prompt_tokens={last.prompt_tokens} "
            f"completion_tokens={last.completion_tokens} in {time.monotonic() - start:.2f} s")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text("".join(parts))
        log(f"wrote {args.out}")
    return 0


def embed(args) -> int:
    import numpy as np

    client = EmbedClient(args.url, timeout_s=args.timeout)
    if (args.text is None) == (args.video is None):
        raise ValueError("give exactly one of --text or --video")
    if args.text is not None:
        vector, patches = client.text(args.model, args.text), None
    else:
        vector, patches = client.video(args.model, args.video.read_bytes(), args.frames)
    log(f"[embed] {vector.shape[0]} dimensions" + (f", {patches.shape[0]} patch embeddings" if patches is not None else ""))
    out = args.out or Path("embedding.npy")
    out.parent.mkdir(parents=True, exist_ok=True)
    np.save(out, vector if patches is None or not args.patches else patches)
    log(f"wrote {out}")
    return 0


def speech(args) -> int:
    client = SpeechClient(args.url, timeout_s=args.timeout)
    ref_audio = args.reference_audio.read_bytes() if args.reference_audio else None
    sampling = {"seed": args.seed} if args.seed is not None else None
    common = dict(voice=args.voice, speed=args.speed, sampling=sampling, reference_audio=ref_audio,
                  reference_text=args.reference_text, instructions=args.instructions, language=args.language)
    out = args.out or Path(f"speech.{'pcm' if args.stream else args.format}")
    if args.stream:
        # Raw PCM as it is synthesized: the file grows while the model speaks.
        out.parent.mkdir(parents=True, exist_ok=True)
        total, rate, start = 0, 0, time.monotonic()
        with out.open("wb") as f:
            for chunk in client.stream(args.model, args.text, **common):
                f.write(chunk.audio)
                f.flush()
                total, rate = total + len(chunk.audio), chunk.sample_rate or rate
                seconds = total / 2 / rate if rate else 0.0
                print(f"\r[speech] {seconds:6.2f} s of audio in {time.monotonic() - start:.2f} s",
                      end="", file=sys.stderr, flush=True)
        log(f"\nwrote {out} (s16le mono PCM at {rate} Hz, {total} bytes)")
        return 0
    with progress("speech"):
        result = client.synthesize(args.model, args.text, response_format=args.format, **common)
    write(out, result.audio)
    log(f"[speech] sample_rate={result.sample_rate} finish_reason={result.finish_reason}")
    return 0


def transcribe(args) -> int:
    words = args.words
    client = TranscribeClient(args.url, timeout_s=args.timeout)
    options = dict(language=args.language, prompt=args.prompt, temperature=args.temperature, translate=args.translate)
    if args.stream:                        # the text as the model writes it (models that stream)
        for piece in client.stream(args.model, args.audio.read_bytes(), **options):
            sys.stdout.write(piece)
            sys.stdout.flush()
        sys.stdout.write("\n")
        return 0
    with progress("transcribe"):
        result = client.transcribe(args.model, args.audio.read_bytes(), words=words, **options)
    body = result.render(args.format, words)
    body = json.dumps(body, ensure_ascii=False, indent=2) if isinstance(body, dict) else body
    print(body)
    if args.out:
        args.out.write_text(body if body.endswith("\n") else body + "\n")
        log(f"wrote {args.out}")
    log(f"[transcribe] {result.duration:.1f} s of audio, {len(result.segments)} segments")
    return 0


def _image_kwargs(args) -> dict:
    return dict(negative_prompt=args.negative_prompt, size=args.size, num_inference_steps=args.steps,
                guidance_scale=args.guidance_scale, seed=args.seed)


def image(args) -> int:
    client = ImageClient(args.url, timeout_s=args.timeout)
    with progress("image"):
        images = client.generate(args.model, args.prompt, n=args.n, output_format=args.format, **_image_kwargs(args))
    out = args.out or Path(f"image.{args.format}")
    for i, data in enumerate(images):
        write(numbered(out, i, len(images)), data)
    return 0


def edit(args) -> int:
    client = ImageClient(args.url, timeout_s=args.timeout)
    with progress("edit"):
        images = client.edit(args.model, [p.read_bytes() for p in args.image], args.prompt, n=args.n,
                             output_format=args.format, **_image_kwargs(args))
    out = args.out or Path(f"edit.{args.format}")
    for i, data in enumerate(images):
        write(numbered(out, i, len(images)), data)
    return 0


class ProgressBar:
    """`[video] ######------ 12/50 steps  8.3 s` on stderr, redrawn in place on a terminal (a line per
    tenth of the steps otherwise, so a log stays short)."""

    def __init__(self, what: str, width: int = 30):
        self.what, self.width, self.start = what, width, time.monotonic()
        self.live, self.logged = sys.stderr.isatty(), -1

    def __call__(self, done: int, total: int) -> None:
        elapsed = time.monotonic() - self.start
        filled = self.width * done // max(total, 1)
        line = f"[{self.what}] {'#' * filled}{'-' * (self.width - filled)} {done}/{total} steps {elapsed:6.1f} s"
        if self.live:
            print("\r" + line, end="", file=sys.stderr, flush=True)
        elif 10 * done // max(total, 1) > self.logged:
            self.logged = 10 * done // max(total, 1)
            log(line)

    def close(self) -> None:
        if self.live:
            print(file=sys.stderr)


def video(args) -> int:
    client = VideoClient(args.url, timeout_s=args.timeout)
    first_frame = args.image.read_bytes() if args.image else None
    bar = ProgressBar("video")
    start = time.monotonic()
    try:
        data = client.generate(args.model, args.prompt, on_progress=bar, image=first_frame,
                               negative_prompt=args.negative_prompt, size=args.size, num_frames=args.frames,
                               seconds=args.seconds, fps=args.fps, num_inference_steps=args.steps,
                               guidance_scale=args.guidance_scale, guidance_scale_2=args.guidance_scale_2,
                               seed=args.seed)
    finally:
        bar.close()
    log(f"[video] done in {time.monotonic() - start:.1f} s")
    write(args.out or Path("video.mp4"), data)
    return 0


# -- arguments -----------------------------------------------------------------------------------
def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m triton_omni.client", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--url", default="localhost:8001",
                        help="Triton server: host:port for gRPC (default localhost:8001) or http://host:port")
    common.add_argument("--model", required=True, help="the model's name (its ensemble YAML's name)")
    common.add_argument("--timeout", type=float, default=900.0, help="seconds to wait for a response")
    common.add_argument("-o", "--out", type=Path, default=None, help="output file")
    sub = ap.add_subparsers(dest="task", required=True)

    c = sub.add_parser("chat", parents=[common], help="chat; the answer streams to stdout")
    c.add_argument("prompt")
    c.add_argument("--system", default=None)
    c.add_argument("--max-tokens", type=int, default=None)
    c.add_argument("--temperature", type=float, default=None, help="0 = greedy")
    c.add_argument("--top-p", type=float, default=None)
    c.add_argument("--seed", type=int, default=None)
    c.add_argument("--stop", action="append", default=[], help="a stop string (repeatable)")
    c.add_argument("--ignore-eos", action="store_true", help="generate max_tokens tokens whatever comes")
    c.add_argument("--no-stream", action="store_true", help="ask for the whole answer in one response")
    c.add_argument("--image", type=Path, action="append", default=[], help="an image for a vision model (repeatable)")
    c.add_argument("--video", type=Path, action="append", default=[], help="a video for a vision model (repeatable)")
    c.add_argument("--fps", type=float, default=None, help="video frames sampled a second (the model's default)")
    c.add_argument("--audio", type=Path, action="append", default=[], help="an audio file for an omni model (repeatable)")
    c.set_defaults(run=chat)

    m = sub.add_parser("embed", parents=[common], help="an embedding of a text or a video, saved as .npy")
    m.add_argument("--text", default=None)
    m.add_argument("--video", type=Path, default=None)
    m.add_argument("--frames", type=int, default=None, help="frames sampled from the video (the model's default)")
    m.add_argument("--patches", action="store_true", help="save the per-patch embeddings [N, D] instead")
    m.set_defaults(run=embed)

    s = sub.add_parser("speech", parents=[common], help="text to speech, written to a file")
    s.add_argument("text")
    s.add_argument("--voice", default=None)
    s.add_argument("--format", choices=FORMATS, default="wav")
    s.add_argument("--speed", type=float, default=None)
    s.add_argument("--seed", type=int, default=None)
    s.add_argument("--reference-audio", type=Path, default=None, help="audio file of the voice to clone")
    s.add_argument("--reference-text", default=None, help="what the reference audio says")
    s.add_argument("--instructions", default=None, help="how to speak (models that take instructions)")
    s.add_argument("--language", default=None, help="the text's language (models that take one; default auto)")
    s.add_argument("--stream", action="store_true", help="write raw PCM (s16le mono) as it is synthesized")
    s.set_defaults(run=speech)

    t = sub.add_parser("transcribe", parents=[common], help="speech to text")
    t.add_argument("audio", type=Path)
    t.add_argument("--language", default=None, help="the speech's language code (e.g. en, eng_Latn)")
    t.add_argument("--prompt", default=None, help="text that guides the model (models that take one)")
    t.add_argument("--temperature", type=float, default=None, help="0 = greedy (models that sample)")
    t.add_argument("--format", choices=TRANSCRIPT_FORMATS, default="text", help="what to print (and write)")
    t.add_argument("--words", action="store_true", help="word timestamps (in verbose_json)")
    t.add_argument("--translate", action="store_true", help="into English (models that translate)")
    t.add_argument("--stream", action="store_true", help="print the text as it is decoded (models that stream)")
    t.set_defaults(run=transcribe)

    def image_args(p, formats=True):
        p.add_argument("prompt")
        p.add_argument("--negative-prompt", default=None)
        p.add_argument("--size", default=None, help="WxH, e.g. 1024x1024")
        p.add_argument("--steps", type=int, default=None, help="num_inference_steps")
        p.add_argument("--guidance-scale", type=float, default=None)
        p.add_argument("--seed", type=int, default=None)
        if formats:
            p.add_argument("-n", type=int, default=None, help="number of images")
            p.add_argument("--format", choices=["png", "jpeg", "webp"], default="png")

    i = sub.add_parser("image", parents=[common], help="text to image")
    image_args(i)
    i.set_defaults(run=image)
    e = sub.add_parser("edit", parents=[common], help="edit images following a prompt")
    image_args(e)
    e.add_argument("--image", type=Path, action="append", required=True, help="input image (repeatable)")
    e.set_defaults(run=edit)
    v = sub.add_parser("video", parents=[common], help="text (+ first frame) to an MP4, with a progress bar")
    image_args(v, formats=False)
    v.add_argument("--frames", type=int, default=None, help="num_frames (1 + a multiple of 4 for Wan)")
    v.add_argument("--seconds", type=float, default=None, help="instead of --frames: the clip's length at --fps")
    v.add_argument("--fps", type=int, default=None, help="frames per second of the MP4 (default: the model's)")
    v.add_argument("--guidance-scale-2", type=float, default=None, help="the second expert's (A14B models)")
    v.add_argument("--image", type=Path, default=None, help="first frame")
    v.set_defaults(run=video)
    return ap


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        return args.run(args)
    except KeyboardInterrupt:
        log("\ninterrupted (the request was cancelled)")
        return 130
    except Exception as exc:  # noqa: BLE001 - one line for the user, not a traceback
        message = exc.message() if hasattr(exc, "message") and callable(exc.message) else str(exc)
        log(f"error: {message}")
        return 1


if __name__ == "__main__":
    sys.exit(main())
