"""The OpenAI-compatible proxy's own cost: streamed chat through the proxy (`/v1/chat/completions`,
stream: true, server-sent events) against the same requests sent straight to Triton over gRPC (one
stream, as a gRPC client does), in the same run, on the same server: qwen3_chat on the Qwen3-0.6B
shape (random weights), fixed prompt and output lengths, greedy, EOS ignored.

    python -m perf_analyzer_configs.benchmarks.bench_proxy            # on the GPU machine: c = 1 ... 256
    python -m perf_analyzer_configs.benchmarks.bench_proxy --smoke    # tiny shape on the CPU (checks the script)
    python -m perf_analyzer_configs.benchmarks.bench_proxy --triton-url localhost:8001   # a server already up

Per concurrency: tokens/s of each path, their time to first token (p50, p90) and the proxy's added
TTFT (its p50 minus direct gRPC's). Writes perf_analyzer_configs/results/proxy.json and its pages.
"""
from __future__ import annotations

import argparse
import http.client
import json
import queue
import statistics
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

from perf_analyzer_configs import results
from perf_analyzer_configs.benchmarks.ar_checkpoints import write_checkpoint
from perf_analyzer_configs.benchmarks.common import ROOT, device_name, percentile, versions

RESULTS = results.RESULTS / "proxy.json"
MODEL = "qwen3_chat"
MODES = ("direct gRPC", "through the proxy")
WORDS = "the quick brown fox jumps over a lazy dog while seven small birds sing".split()


def prompt_text(i: int, words: int) -> str:
    """A user message of about `words` tokens, different per request (no two prompts alike)."""
    return f"{i} " + " ".join(WORDS[(i + k) % len(WORDS)] for k in range(words))


def summarize(mode: str, c: int, wall: float, per: list[dict]) -> dict:
    ttft = [p["ttft"] for p in per]
    tokens = sum(p["tokens"] for p in per)
    return {"mode": mode, "concurrency": c, "requests": len(per),
            "output_tokens": tokens, "wall_s": wall, "tokens_per_s": tokens / wall,
            "ttft_ms_p50": 1e3 * statistics.median(ttft), "ttft_ms_p90": 1e3 * percentile(ttft, 0.9)}


# -- straight to Triton: one gRPC stream carries all c requests (bench_ar_decode's client) -----------
def run_direct(url: str, c: int, args) -> tuple[float, list[dict]]:
    import tritonclient.grpc as grpcclient

    from triton_omni.client.tensors import make_inputs
    from triton_omni.client.triton import host_port, is_final_response, model_config

    first, tokens, errors = [None] * c, [0] * c, []
    left, done = [c], threading.Event()
    sampling = {"max_tokens": args.output_len, "temperature": 0.0, "ignore_eos": True}

    def on_response(result, error):
        now = time.perf_counter()
        if error is not None:
            errors.append(error)
            done.set()
            return
        response = result.get_response()
        i = int(response.id)
        if any(o.name == "completion_tokens" for o in response.outputs):
            n = int(result.as_numpy("completion_tokens").reshape(-1)[0])
            if n > tokens[i]:
                first[i] = first[i] or now
                tokens[i] = n
        if is_final_response(response):
            left[0] -= 1
            if left[0] == 0:
                done.set()

    batched = int(model_config(url, MODEL).get("max_batch_size", 0)) > 0   # the chat fronts take [1] inputs
    requests = [make_inputs(grpcclient, {"messages": ([{"role": "user", "content": prompt_text(i, args.prompt_words)}],
                                                      "BYTES"),
                                         "sampling_parameters": (sampling, "BYTES"), "stream": (True, "BOOL")}, batched)
                for i in range(c)]
    client = grpcclient.InferenceServerClient(host_port(url))
    client.start_stream(callback=on_response)
    try:
        t0 = time.perf_counter()
        for i, inputs in enumerate(requests):
            client.async_stream_infer(MODEL, inputs, request_id=str(i), enable_empty_final_response=True)
        assert done.wait(args.timeout), "the direct run did not finish"
        wall = time.perf_counter() - t0
    finally:
        client.stop_stream()
        client.close()
    assert not errors, errors[0]
    assert tokens == [args.output_len] * c, tokens
    return wall, [{"ttft": f - t0, "tokens": n} for f, n in zip(first, tokens)]


# -- through the proxy: a connection and a thread per request, as c separate SDK clients ---------------
def one_sse(host: str, port: int, body: bytes, t0: float) -> dict:
    conn = http.client.HTTPConnection(host, port, timeout=600)
    try:
        conn.request("POST", "/v1/chat/completions", body, {"Content-Type": "application/json"})
        response = conn.getresponse()
        assert response.status == 200, (response.status, response.read()[:500])
        first, tokens, buffer = None, 0, b""
        while chunk := response.read1(65536):
            buffer += chunk
            *events, buffer = buffer.split(b"\n\n")
            for event in events:
                data = event.removeprefix(b"data: ").strip()
                if not data or data == b"[DONE]":
                    continue
                parsed = json.loads(data)
                if parsed.get("choices") and parsed["choices"][0]["delta"].get("content"):
                    first = first or time.perf_counter()
                if parsed.get("usage"):
                    tokens = parsed["usage"]["completion_tokens"]
        return {"ttft": first - t0, "tokens": tokens}
    finally:
        conn.close()


def run_proxy(proxy_url: str, c: int, args) -> tuple[float, list[dict]]:
    host, port = proxy_url.removeprefix("http://").split(":")
    bodies = [json.dumps({"model": MODEL, "stream": True, "stream_options": {"include_usage": True},
                          "messages": [{"role": "user", "content": prompt_text(i, args.prompt_words)}],
                          "max_tokens": args.output_len, "temperature": 0, "ignore_eos": True}).encode()
              for i in range(c)]
    out: queue.Queue = queue.Queue()
    start = threading.Barrier(c + 1)
    t0 = [0.0]

    def worker(body):
        start.wait()
        try:
            out.put(one_sse(host, int(port), body, t0[0]))
        except Exception as e:  # noqa: BLE001 - reported below
            out.put(e)

    threads = [threading.Thread(target=worker, args=(b,), daemon=True) for b in bodies]
    for th in threads:
        th.start()
    t0[0] = time.perf_counter()
    start.wait()
    per = [out.get(timeout=args.timeout) for _ in threads]
    wall = time.perf_counter() - t0[0]
    failed = [p for p in per if isinstance(p, Exception)]
    assert not failed, failed[0]
    assert [p["tokens"] for p in per] == [args.output_len] * c, [p["tokens"] for p in per]
    return wall, per


# -- the servers --------------------------------------------------------------------------------------
def start_triton(args, target: str):
    from perf_analyzer_configs.benchmarks.common import start_server

    folder = write_checkpoint(args.shape, Path(args.workdir) / "checkpoints")
    c_max = max(args.concurrency)
    overrides = [f"{MODEL}.ar.{k}={v}" for k, v in {
        "load_format": "dummy", "max_num_seqs": c_max, "dtype": args.dtype,
        "max_num_batched_tokens": max(2048, c_max * 64)}.items()]
    overrides += [f"{MODEL}.max_model_len={args.prompt_words * 4 + args.output_len + 64}", *(args.set or [])]
    return start_server(MODEL, folder, overrides, Path(args.workdir), target, timeout=900)


class Proxy:
    """`python -m triton_omni.client.openai_proxy` in front of `triton_url`, as a user starts it."""

    def __init__(self, triton_url: str, workdir: Path):
        from triton_omni.launcher.triton import free_port

        self.port = free_port()
        self.log = open(workdir / "proxy.log", "wb")
        self.proc = subprocess.Popen([sys.executable, "-m", "triton_omni.client.openai_proxy", "--triton-url", triton_url,
                                      "--port", str(self.port), "--log-level", "warning"], cwd=ROOT,
                                     stdout=self.log, stderr=subprocess.STDOUT)
        self.url = f"http://127.0.0.1:{self.port}"
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, f"the proxy exited: see {workdir / 'proxy.log'}"
            try:
                with urllib.request.urlopen(f"{self.url}/v1/models", timeout=2) as r:
                    if MODEL in r.read().decode():
                        return
            except OSError:
                pass
            time.sleep(0.25)
        raise TimeoutError("the proxy did not come up")

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.log.close()


def measure(triton_url: str, proxy_url: str, args) -> list[dict]:
    from triton_omni.client.progress import bar

    run_direct(triton_url, 1, args)               # warm both paths (clients, connections)
    run_proxy(proxy_url, 1, args)
    rows = []
    for c in bar(args.concurrency, desc="concurrency", unit="level"):
        best = {}
        for _ in range(args.repeats):             # the repeat with the most tokens/s of each path
            for mode, run in zip(MODES, (lambda: run_direct(triton_url, c, args), lambda: run_proxy(proxy_url, c, args))):
                row = summarize(mode, c, *run())
                if mode not in best or row["tokens_per_s"] > best[mode]["tokens_per_s"]:
                    best[mode] = row
        direct, proxied = best[MODES[0]], best[MODES[1]]
        proxied["tokens_per_s_vs_direct"] = proxied["tokens_per_s"] / direct["tokens_per_s"]
        proxied["added_ttft_ms_p50"] = proxied["ttft_ms_p50"] - direct["ttft_ms_p50"]
        for row in (direct, proxied):
            rows.append({"model": args.shape, **row})
            print(json.dumps(rows[-1]), flush=True)
    return rows


def intro(data) -> list[str]:
    return [f"qwen3_chat on the {data.get('shape', 'qwen3-0.6b')} shape (random {data.get('dtype', 'bf16')} weights), "
            f"a user message of ~{data.get('prompt_words')} words, {data.get('output_len')} tokens out (greedy, EOS "
            "ignored), streamed. Direct: one gRPC stream carries all c requests to the model's front. Proxy: c "
            "connections to /v1/chat/completions (SSE), a thread each. TTFT: from the wave's start to a request's "
            "first token. Each row: the best of the run's repeats."]


PAGE = results.Page(
    title="OpenAI proxy benchmark", module="perf_analyzer_configs.benchmarks.bench_proxy", intro=intro,
    columns=[results.column("model", "model", numeric=False), results.column("mode", "mode", numeric=False),
             results.column("c", "concurrency"), results.column("tokens/s", "tokens_per_s", ".0f"),
             results.Column("vs direct", lambda r: f"{100 * r['tokens_per_s_vs_direct']:.1f}%"
                            if "tokens_per_s_vs_direct" in r else ""),
             results.column("TTFT p50 ms", "ttft_ms_p50", ".1f"), results.column("TTFT p90 ms", "ttft_ms_p90", ".1f"),
             results.column("added TTFT p50 ms", "added_ttft_ms_p50", ".1f")],
    order=lambda r: (r["concurrency"], MODES.index(r["mode"])),
    plot=results.Plot(panels=[("tokens_per_s", "tokens/s"), ("ttft_ms_p50", "TTFT p50 (ms)")]))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--concurrency", nargs="+", type=int, default=[1, 8, 32, 64, 128, 256])
    ap.add_argument("--shape", default="qwen3-0.6b")
    ap.add_argument("--prompt-words", type=int, default=128)
    ap.add_argument("--output-len", type=int, default=256)
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--set", action="append", help="a converter override (KEY=VALUE) for the server")
    ap.add_argument("--triton-url", help="measure a server already running (gRPC host:port) instead of starting one")
    ap.add_argument("--timeout", type=float, default=900)
    ap.add_argument("--workdir", default="/tmp/triton-omni-bench-proxy")
    ap.add_argument("--out", type=Path, default=RESULTS)
    ap.add_argument("--smoke", action="store_true", help="tiny shape on the CPU, to check the script")
    args = ap.parse_args()
    if args.smoke:
        args.shape, args.concurrency, args.prompt_words, args.output_len = "tiny", [1, 4], 8, 8
        args.dtype, args.repeats = "float32", 1
        args.out = Path(args.workdir) / "proxy.json" if args.out == RESULTS else args.out
    import torch

    target = "gpu" if torch.cuda.is_available() else "cpu"
    workdir = Path(args.workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    server = None if args.triton_url else start_triton(args, target)
    triton_url = args.triton_url or server.grpc_url
    proxy = Proxy(triton_url, workdir)
    try:
        rows = measure(triton_url, proxy.url, args)
    finally:
        proxy.stop()
        if server is not None:
            server.stop()
    meta = {"gpu": device_name(), "versions": versions("transformers", "tritonclient", "fastapi", "uvicorn"),
            "shape": args.shape, "dtype": args.dtype, "prompt_words": args.prompt_words, "output_len": args.output_len}
    results.write(args.out, PAGE, rows, meta)
    print(args.out.with_suffix(".md").read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
