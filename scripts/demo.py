"""The embedded demo: tiny random checkpoints -> model repository -> real tritonserver -> a streamed
chat answer on the terminal and in outputs/. The weights are random: the text is gibberish by design;
what the demo shows is the serving path, end to end."""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from client import ChatClient  # noqa: E402
from converters.__main__ import load_configs  # noqa: E402
from converters.generate import write_repository  # noqa: E402
from converters.tiny import build as build_tiny  # noqa: E402
from launcher import TritonServer  # noqa: E402
from launcher.triton import has_gpu  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--model", default="qwen3_chat", choices=["qwen3_chat", "qwen3_5_chat"])
    ap.add_argument("--prompt", default="Write a haiku about a server that never sleeps.")
    ap.add_argument("--max-tokens", type=int, default=48)
    args = ap.parse_args()
    out = ROOT / "outputs"
    out.mkdir(exist_ok=True)

    t0 = time.monotonic()
    print("[demo] building tiny random checkpoints in checkpoints/tiny (random weights: expect gibberish)")
    build_tiny(ROOT / "checkpoints" / "tiny")
    target = "gpu" if has_gpu() else "cpu"
    repo = ROOT / "model_repository" if target == "cpu" else out / "model_repository_gpu"
    write_repository(load_configs(None, [], []), repo, target)
    print(f"[demo] model repository: {repo} (target {target})")
    with TritonServer(repo, models=[args.model], log_path=out / "tritonserver.log") as server:
        print(f"[demo] tritonserver ready in {time.monotonic() - t0:.1f} s "
              f"(gRPC {server.grpc_url}, HTTP {server.http_url}; log: outputs/tritonserver.log)")
        print(f"[demo] user: {args.prompt}\n[demo] assistant (streamed): ", end="", flush=True)
        client = ChatClient(server.grpc_url)
        text, last = [], None
        start = time.monotonic()
        for chunk in client.stream(args.model, messages=[{"role": "user", "content": args.prompt}],
                                   sampling={"max_tokens": args.max_tokens, "temperature": 0.8, "seed": 7}):
            print(chunk.text, end="", flush=True)
            text.append(chunk.text)
            last = chunk
        took = time.monotonic() - start
        print(f"\n[demo] finish_reason={last.finish_reason} prompt_tokens={last.prompt_tokens} "
              f"completion_tokens={last.completion_tokens} in {took:.2f} s")
    (out / "chat.txt").write_text(f"user: {args.prompt}\nassistant: {''.join(text)}\n")
    print("[demo] wrote outputs/chat.txt; server stopped")
    return 0


if __name__ == "__main__":
    sys.exit(main())
