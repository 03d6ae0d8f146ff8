"""AR decode benchmark: our engine in-process, the same engine behind tritonserver (gRPC streams
through the model's front, the path users take), and Hugging Face transformers `generate` with a
static cache, on real-size shapes with random bf16 weights, in one run on one GPU.

    python -m perf_analyzer_configs.benchmarks.bench_ar_decode           # on the GPU machine
    python -m perf_analyzer_configs.benchmarks.bench_ar_decode --smoke   # tiny shape on the CPU (checks the script)
    python -m perf_analyzer_configs.benchmarks.bench_ar_decode --models qwen3-8b qwen3-0.6b --modes inprocess \
        --concurrency 1 64 --weights bf16 fp8 fp8_lm_head                # FP8 weights against bf16, and their accuracy

Mixture-of-experts shapes (Qwen3-30B-A3B, the shape of Qwen3-Omni-30B-A3B's thinker; Qwen3.5-35B-A3B),
served by their own chat ensembles (ar_checkpoints.ensemble), their c=1 roofline counting the weights
a one-token step reads (the top-k experts of each layer, not all of them):

    python -m perf_analyzer_configs.benchmarks.bench_ar_decode --models qwen3-30b-a3b qwen3.5-35b-a3b \
        --modes inprocess hf --concurrency 1 64 --out moe.json
    python -m perf_analyzer_configs.benchmarks.bench_ar_decode --smoke --models tiny-moe tiny3.5-moe

Fixed prompt length (512) and output length (256, EOS ignored), greedy. Writes
perf_analyzer_configs/results/ar_decode.json (raw numbers, command, GPU, versions) and its pages.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import threading
import time
from pathlib import Path

import torch

from perf_analyzer_configs import results
from perf_analyzer_configs.benchmarks import fp8_accuracy
from triton_omni.client.progress import bar
from perf_analyzer_configs.benchmarks.ar_checkpoints import SHAPES, ensemble, prompts, random_text, write_checkpoint
from perf_analyzer_configs.benchmarks.common import device_name, percentile, release_memory, start_server, versions
from triton_omni.runtime.params import torch_dtype

RESULTS = results.RESULTS / "ar_decode.json"
# the modes the default settings make (--server-model: the shape's chat ensemble, --client stream, --hf-cache static);
# other labels are variants, or defaults of their day relabelled when the defaults changed
CURRENT_MODES = ("ours in-process", "ours via tritonserver", "transformers generate (static cache)")


def summarize(kind, name, c, wall, per_request, output_len):
    ttft = [r["ttft"] for r in per_request]
    tpot = [r["tpot"] for r in per_request]
    return {"model": name, "mode": kind, "concurrency": c, "output_tokens": c * output_len, "wall_s": wall,
            "tokens_per_s": c * output_len / wall, "ttft_ms_p50": 1e3 * statistics.median(ttft),
            "ttft_ms_p90": 1e3 * percentile(ttft, 0.9), "tpot_ms_p50": 1e3 * statistics.median(tpot),
            "tpot_ms_p90": 1e3 * percentile(tpot, 0.9)}


def mark_wave(mode, c, t0_unix, wall, per, sent_s=0.0):
    """With TRITON_OMNI_ENGINE_TRACE=FILE set (the engine's step trace), each wave's start, the time
    the client took to send (or add) its requests and their TTFTs go to FILE.waves, for
    perf_analyzer_configs.trace.engine_trace to line them up."""
    from triton_omni.ar.engine import TRACE_ENV

    path = os.environ.get(TRACE_ENV)
    if path:
        with open(path + ".waves", "a") as f:
            f.write(json.dumps({"mode": mode, "concurrency": c, "t0": t0_unix, "wall_s": wall, "sent_ms": 1e3 * sent_s,
                                "ttft_ms": sorted(1e3 * r["ttft"] for r in per)}) + "\n")


def ar_overrides(args, served: str) -> list[tuple[str, object]]:
    """The `--set ENSEMBLE.ar.KEY=VALUE` overrides of the ensemble that serves the shape (`served`,
    e.g. qwen3_chat), for the in-process engine's parameters (the server modes pass that ensemble's
    --set items to the converter)."""
    import yaml

    from triton_omni.ar.step import ARParams

    out = []
    for item in args.set or []:
        key, _, value = item.partition("=")
        if key.startswith(f"{served}.ar."):
            name = key.removeprefix(f"{served}.ar.")
            if not hasattr(ARParams, name) and name not in ARParams.__dataclass_fields__:
                raise SystemExit(f"--set {item}: the AR step has no parameter {name!r}")
            out.append((name, yaml.safe_load(value)))
    return out


# --- our engine, in-process ----------------------------------------------------------------------
def bench_inprocess(name, folder, args, device, weights="bf16"):
    from triton_omni.ar.engine import EngineThread
    from triton_omni.ar.sampling import SamplingParams
    from triton_omni.ar.step import ARParams, build_engine

    params = ARParams(dtype=args.dtype, max_num_seqs=max(args.concurrency), max_model_len=args.prompt_len + args.output_len + 16,
                      max_num_batched_tokens=max(args.concurrency) * args.prompt_len, load_format="dummy",
                      enforce_eager=args.eager)
    for key, value in ar_overrides(args, ensemble(name)):
        setattr(params, key, value)
    params.quantization, params.quantize_lm_head = fp8_accuracy.WEIGHTS[weights]
    t = time.monotonic()
    engine, _ = build_engine(folder, params, device)
    setup_s = time.monotonic() - t
    loop = EngineThread(engine)
    vocab = engine.vocab_size
    sp = SamplingParams(max_tokens=args.output_len, temperature=0.0, ignore_eos=True)

    def run(c, seed):
        done = threading.Event()
        stamps: dict[int, list[float]] = {}
        finished = [0]

        def on_output(seq, new, reason):
            if new:
                stamps.setdefault(seq.seq_id, []).append(time.perf_counter())
            if reason is not None:
                finished[0] += 1
                if finished[0] == c:
                    done.set()

        t0, t0_unix = time.perf_counter(), time.time()
        for p in prompts(c, args.prompt_len, vocab, seed):
            engine.add(p, sp, on_output)
        sent = time.perf_counter() - t0
        assert done.wait(600), "in-process run did not finish"
        wall = time.perf_counter() - t0
        per = [{"ttft": s[0] - t0, "tpot": (s[-1] - s[0]) / max(len(s) - 1, 1)} for s in stamps.values()]
        assert all(len(s) == args.output_len for s in stamps.values())
        mark_wave("inprocess", c, t0_unix, wall, per, sent)
        return wall, per

    run(1, 99)                                  # warm-up: kernels compiled, graphs replayed once
    run(max(args.concurrency), 98)
    rows = []
    for c in args.concurrency:
        wall, per = run(c, c)
        rows.append(summarize(fp8_accuracy.label("ours in-process", weights), name, c, wall, per, args.output_len))
        print(json.dumps(rows[-1]), flush=True)
    rows[0]["setup_s"] = setup_s
    rows[0]["cuda_graphs"] = engine.runner.use_graphs
    loop.stop()
    if args.profile and (torch.cuda.is_available() or args.smoke):
        for c in sorted({1, max(args.concurrency)}):
            profile_steps(engine, sp, args, c, Path(args.out).parent / f"profile-{name}-{weights}-c{c}.txt")
    return rows


def profile_steps(engine, sp, args, c: int, path: Path) -> None:
    """Kernels and host time of the prefill of c prompts (up to their first tokens), then of 20
    decode steps with the c sequences running. The engine is stepped from this thread (its loop is
    stopped), so the profiler records the host-side ops too."""
    from torch.profiler import ProfilerActivity, profile

    def tables(prof, what: str, ms: float) -> str:
        events = [e for e in prof.events() if e.device_type.name == "CUDA"]
        gpu_ms = sum(e.device_time for e in events) / 1e3
        return (f"{what}: {ms:.1f} ms under the profiler; {len(events)} kernels, {gpu_ms:.1f} ms of kernel time\n"
                + prof.key_averages().table(sort_by="cuda_time_total", row_limit=25)
                + prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=25) + "\n")

    seqs = [engine.add(p, sp) for p in prompts(c, args.prompt_len, engine.vocab_size, 11)]
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        t0 = time.perf_counter()
        while not all(s.output_ids for s in seqs):
            engine.step()
        prefill_ms = 1e3 * (time.perf_counter() - t0)
    out = tables(prof, f"prefill of {c} prompts of {args.prompt_len} tokens to their first tokens", prefill_ms)
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        t0 = time.perf_counter()
        for _ in range(20):
            engine.step()
        decode_ms = 1e3 * (time.perf_counter() - t0)
    out += tables(prof, f"20 decode steps of {c} sequences", decode_ms)
    engine.run_until_done()
    path.write_text(out)


# --- our engine behind tritonserver --------------------------------------------------------------
def serve(folder, args, target, served: str, weights="bf16"):
    """tritonserver with the chat ensemble `served` on the benchmark's shape (dummy weights); returns
    (server, setup s)."""
    c_max = max(args.concurrency)
    quantization, lm_head = fp8_accuracy.WEIGHTS[weights]
    overrides = [f"{served}.ar.{k}={v}" for k, v in {
        "load_format": "dummy", "max_num_seqs": c_max, "dtype": args.dtype, "enforce_eager": str(args.eager).lower(),
        "max_num_batched_tokens": c_max * args.prompt_len, "quantization": quantization,
        "quantize_lm_head": str(lm_head).lower()}.items()]
    overrides.append(f"{served}.max_model_len={args.prompt_len + args.output_len + 16}")
    overrides += [item for item in args.set or [] if item.startswith(f"{served}.")]
    t = time.monotonic()
    server = start_server(served, folder, overrides, Path(args.workdir), target,
                          getattr(args, "server_arg", None) or [], timeout=900)
    return server, time.monotonic() - t


def bench_server(name, folder, args, target, weights="bf16"):
    """gRPC streaming against the live server: TTFT and TPOT per request, from the first send.
    `--client stream` (default): one client and one gRPC stream carry all c requests, the responses
    told apart by request id, as the in-process run adds all c prompts from one thread.
    `--client threads`: our ChatClient, one thread, client and stream per request."""
    import tritonclient.grpc as grpcclient

    from triton_omni.client.chat import ChatClient
    from triton_omni.client.tensors import make_inputs
    from triton_omni.client.triton import host_port, is_final_response

    served = ensemble(name)
    server_model = args.server_model or served
    server, setup_s = serve(folder, args, target, served, weights)
    rng = random.Random(0)
    sampling = {"max_tokens": args.output_len, "temperature": 0.0, "ignore_eos": True}

    def one(prompt, t0):
        stamps, tokens = [], 0
        for chunk in ChatClient(server.grpc_url, timeout_s=600).stream(server_model, prompt=prompt, sampling=sampling):
            if chunk.completion_tokens > tokens:
                stamps.append(time.perf_counter())
                tokens = chunk.completion_tokens
        assert tokens == args.output_len, tokens
        return {"ttft": stamps[0] - t0, "tpot": (stamps[-1] - stamps[0]) / (args.output_len - 1)}

    def run_threads(texts):
        results = [None] * len(texts)
        t0 = time.perf_counter()

        def worker(i):
            results[i] = one(texts[i], t0)

        threads = [threading.Thread(target=worker, args=(i,)) for i in range(len(texts))]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
        return time.perf_counter() - t0, results

    def run_stream(texts):
        c = len(texts)
        stamps, tokens, errors = [[] for _ in range(c)], [0] * c, []
        left, done = [c], threading.Event()

        def on_response(result, error):
            now = time.perf_counter()
            if error is not None:
                errors.append(error)
                done.set()
                return
            response = result.get_response()
            i = int(response.id)
            if any(o.name == "completion_tokens" for o in response.outputs):
                n = int(result.as_numpy("completion_tokens")[0])
                if n > tokens[i]:
                    stamps[i].append(now)
                    tokens[i] = n
            if is_final_response(response):
                left[0] -= 1
                if left[0] == 0:
                    done.set()

        batched = server_model != served       # the front takes [1] inputs, as the vLLM backend's models
        requests = [make_inputs(grpcclient, {"text_input": (t, "BYTES"), "sampling_parameters": (sampling, "BYTES"),
                                             "stream": (True, "BOOL")}, batched) for t in texts]
        client = grpcclient.InferenceServerClient(host_port(server.grpc_url))
        client.start_stream(callback=on_response)
        try:
            t0, t0_unix = time.perf_counter(), time.time()
            for i, inputs in enumerate(requests):
                client.async_stream_infer(server_model, inputs, request_id=str(i), enable_empty_final_response=True)
            sent = time.perf_counter() - t0
            assert done.wait(600), "server run did not finish"
            wall = time.perf_counter() - t0
        finally:
            client.stop_stream()
            client.close()
        assert not errors, errors[0]
        assert tokens == [args.output_len] * c, tokens
        per = [{"ttft": s[0] - t0, "tpot": (s[-1] - s[0]) / (args.output_len - 1)} for s in stamps]
        mark_wave("server", c, t0_unix, wall, per, sent)
        return wall, per

    def run(c):
        texts = [random_text(rng, args.prompt_len) for _ in range(c)]
        return (run_stream if args.client == "stream" else run_threads)(texts)

    try:
        run(1)
        run(max(args.concurrency))
        rows = []
        for c in args.concurrency:
            wall, per = run(c)
            mode = "ours via tritonserver" + ("" if server_model == served else f" ({server_model})") \
                + ("" if args.client == "stream" else " (a client per request)")
            mode = fp8_accuracy.label(mode, weights)
            rows.append(summarize(mode, name, c, wall, per, args.output_len))
            print(json.dumps(rows[-1]), flush=True)
        rows[0]["setup_s"] = setup_s
        return rows
    finally:
        server.stop()


def bench_server_perf_analyzer(name, folder, args, target):
    """Triton's perf_analyzer (a C++ client) streaming against the same server, on two models: the
    front users call (text in: pre -> AR -> detokenize, relayed) and the AR step alone (token ids in
    and out). The gap between them is the cost of the ensemble's other steps and hops; the gap
    between the front here and `bench_server` is our Python client's. perf_analyzer counts responses
    (one a token); it reports a request's whole latency, so TPOT here is latency / output tokens
    (TTFT included) and TTFT is not measured."""
    from perf_analyzer_configs.runner import perf_analyzer

    served = ensemble(name)
    server, setup_s = serve(folder, args, target, served)
    rng = random.Random(0)
    sampling = json.dumps({"max_tokens": args.output_len, "temperature": 0.0, "ignore_eos": True})
    vocab = SHAPES[name]["vocab_size"]
    work = Path(args.workdir) / "perf_analyzer"
    work.mkdir(parents=True, exist_ok=True)
    c_max = max(args.concurrency)
    data = {   # c_max different prompts per target, cycled through by perf_analyzer
        served: [{"text_input": [random_text(rng, args.prompt_len)], "sampling_parameters": [sampling],
                        "stream": [True]} for _ in range(c_max)],
        f"{served}_ar": [{"input_ids": {"content": ids, "shape": [len(ids)]}, "sampling": [sampling],
                           "stream": [True]} for ids in prompts(c_max, args.prompt_len, vocab, seed=1)],
    }
    settings = perf_analyzer.Settings(measurement_ms=args.pa_window_ms, max_trials=3, stability_percent=50)
    rows = []
    try:
        for model, kind in ((served, "ours via tritonserver, perf_analyzer"),
                            (f"{served}_ar", "AR step alone via tritonserver, perf_analyzer")):
            path = work / f"{model}.json"
            path.write_text(json.dumps({"data": data[model]}))
            for c in args.concurrency:
                found, _, cmd = perf_analyzer.run(model, server.grpc_url, path, work / f"{model}_c{c}.csv", c,
                                                  settings, streaming=True, timeout_s=600)
                r = found[0]
                tokens_per_s = r["response_throughput_per_s"]
                rows.append({"model": name, "mode": kind, "concurrency": c, "tokens_per_s": tokens_per_s,
                             "requests_per_s": r["throughput_per_s"], "tpot_ms_p50": r["avg_latency_us"] / 1e3
                             / args.output_len, "latency_ms_avg": r["avg_latency_us"] / 1e3,
                             "latency_ms_p90": r.get("p90_latency_us", 0) / 1e3})
                print(json.dumps(rows[-1]), flush=True)
        rows[0]["setup_s"] = setup_s
        return rows
    finally:
        server.stop()


# --- Hugging Face transformers -------------------------------------------------------------------
def bench_hf(name, folder, args, device):
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(str(folder))
    dtype = {"bfloat16": torch.bfloat16, "float32": torch.float32}[args.dtype]
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype).eval()
    vocab = config.vocab_size
    rows = []

    def gen(ids, n):
        kwargs = dict(max_new_tokens=n, min_new_tokens=n, do_sample=False, eos_token_id=None, pad_token_id=0,
                      attention_mask=torch.ones_like(ids))
        if args.hf_cache == "static":
            kwargs.update(cache_implementation="static", disable_compile=not args.hf_compile)
        with torch.inference_mode():
            out = model.generate(ids, **kwargs)
        if device != "cpu":
            torch.cuda.synchronize()
        return out

    for c in args.concurrency:
        ids = torch.tensor(prompts(c, args.prompt_len, vocab, c), device=device)
        gen(ids, 4)                                              # warm-up (and compile, if asked)
        t0 = time.perf_counter()
        gen(ids, 1)
        ttft = time.perf_counter() - t0
        t0 = time.perf_counter()
        out = gen(ids, args.output_len)
        wall = time.perf_counter() - t0
        assert out.shape[1] == args.prompt_len + args.output_len
        per = [{"ttft": ttft, "tpot": (wall - ttft) / (args.output_len - 1)}] * c
        label = f"transformers generate ({args.hf_cache} cache{', compiled' if args.hf_compile else ''})"
        rows.append(summarize(label, name, c, wall, per, args.output_len))
        print(json.dumps(rows[-1]), flush=True)
    return rows


# --- roofline ------------------------------------------------------------------------------------
def copy_bandwidth(device) -> float:
    """Bytes moved per second (read + write) by a large device-to-device copy."""
    if device == "cpu":
        return float("nan")
    x = torch.empty(2 << 30, dtype=torch.uint8, device=device)
    y = torch.empty_like(x)
    for _ in range(3):
        y.copy_(x)
    torch.cuda.synchronize()
    times = []
    for _ in range(10):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        y.copy_(x)
        e.record()
        e.synchronize()
        times.append(s.elapsed_time(e) / 1e3)
    del x, y
    torch.cuda.empty_cache()
    return 2 * (2 << 30) / statistics.median(times)


def decode_bytes_per_step(folder: Path, context: float, dtype_bytes: int = 2, weights: str = "bf16") -> float:
    """Bytes one batch-1 decode step must move: every weight once (the embedding table only as the
    lm_head when tied, else one row; of a mixture-of-experts layer only the top-k experts a token
    goes to, besides its router and shared expert), K/V of the full-attention layers at `context`,
    and the fp32 recurrent state of the linear-attention layers read and written. Counted on our own
    model class built on the meta device, so it is the model the engine actually runs. FP8 `weights`:
    the layers' linear weights (and the lm_head's with fp8_lm_head) one byte each, plus their scales."""
    from triton_omni.models.context import AttentionCacheSpec, RecurrentStateSpec
    from triton_omni.models.layers import Linear, MergedLinear
    from triton_omni.models.registry import MODELS, text_config

    config, model_type = text_config(folder)
    module, cls = MODELS[model_type]
    with torch.device("meta"):
        model = getattr(__import__(module, fromlist=[cls]), cls)(config)
    params = {id(p): p.numel() for p in model.parameters()}
    elements = sum(params.values())
    if not config.tie_word_embeddings:
        elements -= model.model.embed_tokens.weight.numel() - config.hidden_size
    for m in model.modules():
        if hasattr(m, "experts") and hasattr(m, "top_k"):         # models/moe.py's SparseMoeBlock
            per_expert = sum(p.numel() for p in m.experts.parameters()) // m.num_experts
            elements -= (m.num_experts - m.top_k) * per_expert
    total = elements * dtype_bytes
    if weights != "bf16":
        fp8 = [m.weight for m in model.modules() if isinstance(m, (Linear, MergedLinear))]
        fp8 += [model.lm_head.weight] if fp8_accuracy.WEIGHTS[weights][1] else []
        total -= sum(w.numel() * (dtype_bytes - 1) - 4 * w.shape[0] for w in fp8)   # 1 byte + a scale a row
    for m in model.modules():
        if hasattr(m, "cache_spec"):
            spec = m.cache_spec()
            if isinstance(spec, AttentionCacheSpec):
                total += 2 * spec.num_kv_heads * spec.head_dim * context * dtype_bytes
            elif isinstance(spec, RecurrentStateSpec):
                n = 1
                for x in spec.state_shape:
                    n *= x
                total += 2 * 4 * n
    return total


def roofline_key(model: str, weights: str) -> str:
    return model if weights == "bf16" else f"{model} ({weights} weights)"


def roofline(models, args) -> dict:
    """Per (model, weights): the bytes of a batch-1 decode step at the mean context, and that over the copy bandwidth."""
    out = {}
    for name, weights in models:
        step_bytes = decode_bytes_per_step(write_checkpoint(name, Path(args.workdir) / "checkpoints"),
                                           args.prompt_len + args.output_len / 2, weights=weights)
        ideal = step_bytes / args.bandwidth if args.bandwidth == args.bandwidth else None
        out[roofline_key(name, weights)] = {"bytes_per_step_c1": step_bytes, "ideal_tpot_ms_c1": ideal and 1e3 * ideal}
    return out


def write_results(rows, args, path: Path, gpu=None, run_versions=None, date=None, notes=(), accuracy=()):
    lines = roofline(sorted({(r["model"], fp8_accuracy.weights_of(r["mode"])) for r in rows}), args)
    for r in rows:
        ideal = lines[roofline_key(r["model"], fp8_accuracy.weights_of(r["mode"]))]["ideal_tpot_ms_c1"]
        if r["concurrency"] == 1 and ideal:
            r["roofline_share_c1"] = ideal / r["tpot_ms_p50"]
    meta = {"gpu": gpu or device_name(), "versions": run_versions or versions("transformers", "triton"),
            "copy_bandwidth_GBps": args.bandwidth / 1e9, "prompt_len": args.prompt_len,
            "output_len": args.output_len, "dtype": args.dtype, "roofline": lines}
    if accuracy:
        meta["fp8_accuracy"] = list(accuracy)
    results.write(path, PAGE, rows, meta, notes, date)


def intro(data) -> list[str]:
    return [f"Prompt {data['prompt_len']} tokens, {data['output_len']} output tokens (EOS ignored), greedy, "
            f"{data['dtype']}, random weights. Copy bandwidth {data['copy_bandwidth_GBps']:.0f} GB/s (read + write)."]


def after(rows, data) -> list[str]:
    fp8 = fp8_accuracy.speedups(rows, "tokens_per_s", 1.6, "tokens/s")
    return [*roofline_line(rows, data), *(["", "FP8 weights:", "", *[f"- {t}" for t in fp8]] if fp8 else []),
            *fp8_accuracy.table_lines(data.get("fp8_accuracy", []))]


def roofline_line(rows, data) -> list[str]:
    ideal = [f"{k} {v['ideal_tpot_ms_c1']:.2f} ms" for k, v in data["roofline"].items() if v["ideal_tpot_ms_c1"]]
    return ["Roofline: (weight bytes + KV bytes at the mean context) per step / measured copy bandwidth: "
            + ", ".join(ideal)] if ideal else []


PAGE = results.Page(
    title="AR decode benchmark", module="perf_analyzer_configs.benchmarks.bench_ar_decode", intro=intro, after=after,
    columns=[results.column("model", "model", numeric=False), results.column("mode", "mode", numeric=False),
             results.column("concurrency", "concurrency"), results.column("tokens/s", "tokens_per_s", ".0f"),
             results.column("TPOT p50 ms", "tpot_ms_p50", ".2f"),
             results.Column("TTFT p50 ms", lambda r: f"{r['ttft_ms_p50']:.1f}" if "ttft_ms_p50" in r else "n/a"),
             results.Column("roofline share (c=1)",
                            lambda r: f"{100 * r['roofline_share_c1']:.0f}%" if "roofline_share_c1" in r else "")],
    current=lambda r: fp8_accuracy.base_mode(r["mode"]) in CURRENT_MODES,
    order=lambda r: (list(SHAPES).index(r["model"]), CURRENT_MODES.index(fp8_accuracy.base_mode(r["mode"])),
                     list(fp8_accuracy.WEIGHTS).index(fp8_accuracy.weights_of(r["mode"])), r["concurrency"]),
    plot=results.Plot(panels=[("tokens_per_s", "tokens/s"), ("ttft_ms_p50", "TTFT p50 (ms)"),
                              ("tpot_ms_p50", "TPOT p50 (ms)")]))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", nargs="+", default=["qwen3-0.6b", "qwen3-8b", "qwen3.5-0.8b", "qwen3.5-9b"],
                    choices=sorted(SHAPES))
    ap.add_argument("--modes", nargs="+", default=["inprocess", "server", "hf"],
                    choices=["inprocess", "server", "server-pa", "hf"],
                    help="server-pa: perf_analyzer against the server's front and its AR step")
    ap.add_argument("--set", action="append",
                    help="a converter override (ENSEMBLE.KEY=VALUE) for the server modes of the shapes ENSEMBLE serves "
                         "(qwen3_chat, qwen3_moe_chat, ...: ar_checkpoints.ensemble); ENSEMBLE.ar.* ones apply in-process too")
    ap.add_argument("--server-arg", action="append", default=[],
                    help="an extra tritonserver argument for the server modes, e.g. --server-arg=--trace-config=rate=1")
    ap.add_argument("--server-model", default=None,
                    help="the model the server mode's clients call (default: the shape's chat ensemble, e.g. qwen3_chat; "
                         "qwen3_chat_ensemble: the ensemble without its front)")
    ap.add_argument("--client", default="stream", choices=["stream", "threads"],
                    help="server mode: one gRPC stream for all requests, or a client and thread per request")
    ap.add_argument("--pa-window-ms", type=int, default=10000, help="perf_analyzer's measurement window")
    ap.add_argument("--concurrency", nargs="+", type=int, default=[1, 8, 32, 64])
    ap.add_argument("--prompt-len", type=int, default=512)
    ap.add_argument("--output-len", type=int, default=256)
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--weights", nargs="+", default=["bf16"], choices=list(fp8_accuracy.WEIGHTS),
                    help="the engine's weights, each timed in the in-process and server modes: bf16 (--dtype), or FP8 "
                         "(per channel, per 128x128 block, or per channel with the lm_head too); an FP8 kind also "
                         "gets an accuracy table against bf16 on the same random weights")
    ap.add_argument("--hf-cache", default="static", choices=["static", "dynamic"])
    ap.add_argument("--hf-compile", action="store_true", help="let transformers compile its static-cache decode")
    ap.add_argument("--eager", action="store_true", help="our engine without CUDA graphs")
    ap.add_argument("--profile", action="store_true", help="write kernel profiles of decoding, and of prefill to the first token, at c=1 and the largest c")
    ap.add_argument("--workdir", default="/tmp/triton-omni-bench")
    ap.add_argument("--out", type=Path, default=RESULTS)
    ap.add_argument("--smoke", action="store_true", help="tiny shape on the CPU, to check the script")
    ap.add_argument("--merge", nargs="+", type=Path, help="combine the results of separate runs into --out")
    ap.add_argument("--note", action="append", default=[], help="a note for the results")
    args = ap.parse_args()
    if args.merge:
        parts, rows, notes = results.merge_parts(args.merge, ("model", "mode", "concurrency"), args.note)
        first = parts[0]
        args.prompt_len, args.output_len, args.dtype = first["prompt_len"], first["output_len"], first["dtype"]
        args.bandwidth = first["copy_bandwidth_GBps"] * 1e9
        write_results(rows, args, args.out, first["gpu"], first["versions"], max(p["date"] for p in parts), notes,
                      [e for p in parts for e in p.get("fp8_accuracy", [])])
        print(args.out.with_suffix(".md").read_text())
        return 0
    if args.smoke:
        if not all(m.startswith("tiny") for m in args.models):       # --smoke alone: the dense tiny shape
            args.models = ["tiny"]
        args.concurrency, args.prompt_len, args.output_len = [1, 2], 16, 8
        args.dtype, args.hf_cache = "float32", "dynamic"
    device = "cuda:0" if torch.cuda.is_available() else "cpu"
    target = "gpu" if device != "cpu" else "cpu"
    Path(args.workdir).mkdir(parents=True, exist_ok=True)
    args.bandwidth = copy_bandwidth(device)
    rows, accuracy, notes = [], [], list(args.note)
    for name in args.models:
        folder = write_checkpoint(name, Path(args.workdir) / "checkpoints")
        for weights in [w for w in args.weights if w != "bf16"]:
            entry = {"model": name, "weights": weights, "rows": fp8_accuracy.ar_accuracy(
                folder, device, torch_dtype(args.dtype), weights, args.prompt_len)}
            accuracy.append(entry)
            notes.append(fp8_accuracy.summary(name, weights, entry["rows"], args.dtype))
            print(notes[-1], flush=True)
            release_memory()
        parts = [(m, w) for m in args.modes for w in (args.weights if m in ("inprocess", "server") else ["bf16"])]
        for mode, weights in bar(parts, desc=name, unit="part"):
            if mode == "inprocess":
                rows += bench_inprocess(name, folder, args, device, weights)
            elif mode == "server":
                rows += bench_server(name, folder, args, target, weights)
            elif mode == "server-pa":
                rows += bench_server_perf_analyzer(name, folder, args, target)
            else:
                rows += bench_hf(name, folder, args, device)
            release_memory()
            write_results(rows, args, args.out, notes=notes, accuracy=accuracy)   # a timeout keeps what ran
    print(args.out.with_suffix(".md").read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
