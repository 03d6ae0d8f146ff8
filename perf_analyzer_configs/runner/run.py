"""perf_analyzer against every served model, into one Markdown + JSON table.

    python -m perf_analyzer_configs.runner.run              # all models, tiny checkpoints, a CPU
                                                            # tritonserver started (and stopped) here
    python -m perf_analyzer_configs.runner.run --url localhost:8001 --models qwen3_chat --concurrency 1 8 32
    python -m perf_analyzer_configs.runner.run --write-inputs      # refresh perf_analyzer_configs/runner/inputs/

Each model is measured through the name clients call (a streaming model's front, with --streaming)
with its input-data JSON: `inputs/<model>.json` when there is one, else built for its OpenAI route
(inputs.py). `--max-tokens` / `--input NAME=VALUE` build a variant next to the results instead.
Writes perf_analyzer.json and perf_analyzer.md to --out (default perf_analyzer_configs/results/).
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import sys
import tempfile
from pathlib import Path

from perf_analyzer_configs.results import RESULTS
from perf_analyzer_configs.runner import inputs, perf_analyzer

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]


def served_models(names: list[str] | None) -> dict[str, str]:
    """name -> OpenAI route, for the YAMLs that have one (all of them by default)."""
    from triton_omni.converters.__main__ import load_configs

    return {c.name: c.openai["route"] for c in load_configs(names, [], []) if c.openai.get("route")}


def input_file(model: str, route: str, args, work: Path) -> Path:
    committed = args.inputs_dir / f"{model}.json"
    if committed.exists() and args.max_tokens is None and not args.input:
        return committed
    data = inputs.input_data(route, args.max_tokens or 128, args.input)
    return inputs.write(work / "inputs" / f"{model}.json", data)


def measure(url: str, models: dict[str, str], args, work: Path) -> tuple[list[dict], dict]:
    from triton_omni.client.triton import is_decoupled, model_config

    settings = perf_analyzer.Settings(args.measurement_ms, args.max_trials, args.stability, args.measurement_requests)
    rows, commands = [], {}
    for model, route in models.items():
        streaming = is_decoupled(model_config(url, model))
        data = input_file(model, route, args, work)
        for c in args.concurrency:
            print(f"[perf] {model} ({route}{', streaming' if streaming else ''}) concurrency {c}", flush=True)
            found, _, cmd = perf_analyzer.run(model, url, data, work / f"{model}_c{c}.csv", c, settings, streaming,
                                              timeout_s=args.timeout)
            for row in found:
                rows.append({"model": model, "route": route, "streaming": streaming, **row})
                print(f"[perf]   {row.get('throughput_per_s', 0):.2f} requests/s, "
                      f"p50 {row.get('p50_latency_us', 0) / 1e3:.1f} ms", flush=True)
            commands[f"{model}@{c}"] = " ".join(cmd).replace(str(work), "<tmp>")
    return rows, commands


def markdown(rows: list[dict], meta: dict) -> str:
    lines = [f"# perf_analyzer results ({meta['date']})", "",
             f"{meta['perf_analyzer']}; server: {meta['server']}; machine: {meta['machine']}.",
             "Latency: perf_analyzer's request latency (for streaming models, the whole stream).", "",
             "| model | route | concurrency | requests/s | responses/s | avg ms | p50 ms | p90 ms | p99 ms |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    ms = lambda r, k: f"{r[k] / 1e3:.1f}" if k in r else "-"  # noqa: E731
    for r in rows:
        responses = f"{r['response_throughput_per_s']:.1f}" if "response_throughput_per_s" in r else "-"
        lines.append(f"| {r['model']} | {r['route']} | {r['concurrency']} | {r.get('throughput_per_s', 0):.2f} | "
                     f"{responses} | {ms(r, 'avg_latency_us')} | {ms(r, 'p50_latency_us')} | "
                     f"{ms(r, 'p90_latency_us')} | {ms(r, 'p99_latency_us')} |")
    return "\n".join(lines) + "\n"


def write_results(rows: list[dict], meta: dict, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "perf_analyzer.json").write_text(json.dumps({**meta, "rows": rows}, indent=1) + "\n")
    (out / "perf_analyzer.md").write_text(markdown(rows, meta))
    print(f"[perf] wrote {out / 'perf_analyzer.md'} and perf_analyzer.json", flush=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", nargs="+", default=None, help="default: every ensemble YAML with an OpenAI route")
    ap.add_argument("--url", default=None, help="a running server's gRPC endpoint; default: start one here")
    ap.add_argument("--set", action="append", default=[], dest="overrides", metavar="NAME.STEP.PARAM=VALUE",
                    help="converter overrides for the server started here")
    ap.add_argument("--concurrency", nargs="+", type=int, default=[1, 4])
    ap.add_argument("--measurement-ms", type=int, default=3000)
    ap.add_argument("--measurement-requests", type=int, default=0,
                    help="> 0: each window lasts until this many requests completed (slow models; replaces --measurement-ms)")
    ap.add_argument("--max-trials", type=int, default=5)
    ap.add_argument("--stability", type=float, default=10.0, help="perf_analyzer's --stability-percentage")
    ap.add_argument("--timeout", type=float, default=1800.0, help="seconds one perf_analyzer run may take")
    ap.add_argument("--max-tokens", type=int, default=None, help="chat: tokens per request (default 128)")
    ap.add_argument("--input", action="append", default=[], metavar="NAME=VALUE",
                    help="set an input in every request, e.g. size=512x512")
    ap.add_argument("--inputs-dir", type=Path, default=HERE / "inputs")
    ap.add_argument("--out", type=Path, default=RESULTS)
    ap.add_argument("--write-inputs", action="store_true", help="write inputs/<model>.json for the models and stop")
    args = ap.parse_args(argv)

    models = served_models(args.models)
    if args.write_inputs:
        for model, route in models.items():
            print(inputs.write(args.inputs_dir / f"{model}.json", inputs.input_data(route)))
        return 0

    meta = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "perf_analyzer": perf_analyzer.version(), "machine": f"{platform.machine()}, {os.cpu_count()} CPUs",
            "settings": {"concurrency": args.concurrency, "measurement_ms": args.measurement_ms,
                         "max_trials": args.max_trials, "stability_percent": args.stability,
                         "measurement_requests": args.measurement_requests,
                         "max_tokens": args.max_tokens, "inputs": args.input}}
    with tempfile.TemporaryDirectory(prefix="perf_analyzer_") as tmp:
        work = Path(tmp)
        if args.url:
            meta["server"] = args.url
            rows, commands = measure(args.url, models, args, work)
        else:
            from triton_omni.converters.__main__ import load_configs
            from triton_omni.converters.generate import write_repository
            from triton_omni.converters.tiny import build
            from triton_omni.launcher.triton import TritonServer

            build(ROOT / "checkpoints" / "tiny")
            repo = work / "model_repository"
            write_repository(load_configs(list(models), [], args.overrides), repo, "cpu")
            with TritonServer(repo, models=list(models), log_path=work / "tritonserver.log") as server:
                meta["server"] = "started by run.py (tiny random checkpoints, CPU target)"
                rows, commands = measure(server.grpc_url, models, args, work)
        meta["commands"] = commands
        write_results(rows, meta, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
