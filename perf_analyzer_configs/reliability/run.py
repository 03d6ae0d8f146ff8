"""The reliability report: bad requests to every model and step, faults, overload, a soak.

    .venv/bin/python -m perf_analyzer_configs.reliability.run                    # corpus, faults, overload
    .venv/bin/python -m perf_analyzer_configs.reliability.run --soak-minutes 30  # and 30 minutes of mixed load

One tritonserver (the CPU tiny checkpoints, loopback only) serves MODELS. Writes
perf_analyzer_configs/results/reliability.md and .json: requests tried per model and interface, answers
by code, and what counts as a fault: INTERNAL errors, hangs (no answer within DEADLINE_S), streams left
without their final response, stubs or the server that died; then the faults injected and how each
recovered, the overload figures, and the soak's memory and engine occupancy before and after.
"""
from __future__ import annotations

import argparse
import collections
import io
import json
import os
import queue
import signal
import threading
import time
import urllib.request
import wave
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from perf_analyzer_configs.benchmarks.common import ROOT
from perf_analyzer_configs.reliability.corpus import Case, cases
from triton_omni.client.chat import ChatClient
from triton_omni.client.image import ImageClient
from triton_omni.client.speech import SpeechClient
from triton_omni.client.transcribe import TranscribeClient
from triton_omni.converters.__main__ import load_configs
from triton_omni.converters.generate import write_repository
from triton_omni.launcher.triton import TritonServer, group_processes
from triton_omni.launcher.watchdog import model_ready, stub_models

DEADLINE_S = 60.0
RESULTS = ROOT / "perf_analyzer_configs" / "results"
CHAT_SLOTS, CHAT_WAITING = 4, 4
OVERRIDES = [f"qwen3_chat.ar.max_num_seqs={CHAT_SLOTS}", f"qwen3_chat.ar.max_waiting_seqs={CHAT_WAITING}",
             "z_image_turbo.denoise.max_queue_size=4"]


def wav_bytes(seconds: float = 1.0, rate: int = 16000) -> bytes:
    t = np.arange(int(seconds * rate)) / rate
    pcm = (0.3 * np.sin(2 * np.pi * 220 * t) * 32767).astype(np.int16)
    buf = io.BytesIO()
    with wave.open(buf, "wb") as w:
        w.setnchannels(1), w.setsampwidth(2), w.setframerate(rate), w.writeframes(pcm.tobytes())
    return buf.getvalue()


# A good request of each served model: the corpus checks each still answers one afterwards; the soak mixes them.
GOOD = {
    "qwen3_chat": lambda url: ChatClient(url, 120).complete(
        "qwen3_chat", messages=[{"role": "user", "content": "Hi"}], sampling={"max_tokens": 16}).completion_tokens > 0,
    "kokoro_tts": lambda url: len(SpeechClient(url, 120).synthesize("kokoro_tts", "Hello there.").audio) > 1000,
    "orpheus_tts": lambda url: len(SpeechClient(url, 120).synthesize(
        "orpheus_tts", "Hello.", sampling={"max_tokens": 28, "ignore_eos": True}).audio) > 100,
    "omnivoice_tts": lambda url: len(SpeechClient(url, 120).synthesize("omnivoice_tts", "Hello.").audio) > 100,
    "z_image_turbo": lambda url: ImageClient(url, 120).generate(
        "z_image_turbo", "a cat", size="64x64", num_inference_steps=2)[0].startswith(b"\x89PNG"),
    "flux2_klein": lambda url: ImageClient(url, 120).generate(
        "flux2_klein", "a cat", size="64x64", num_inference_steps=2)[0].startswith(b"\x89PNG"),
    "omniasr_ctc": lambda url: isinstance(TranscribeClient(url, 120).transcribe("omniasr_ctc", wav_bytes()).text, str),
}
MODELS = list(GOOD)
# The other models, a server each group (fewer models per process on a small machine): the corpus only,
# and afterwards each model must still report ready.
GROUPS = [["qwen3_5_chat", "qwen3_5_vl_chat", "qwen3_embed", "vjepa2_embed"],
          ["qwen3_moe_chat", "qwen3_5_moe_chat", "qwen3_asr", "omniasr_llm", "higgs_audio"],
          ["qwen3_tts", "qwen3_tts_base", "fish_s2_tts", "chatterbox_tts"],
          ["bagel", "qwen_image_edit", "joyai_image_edit"],
          ["wan2_2_ti2v", "wan2_2_t2v_a14b", "wan2_2_i2v_a14b"],
          ["cosmos3_t2v", "qwen3_omni"]]


class Tally:
    def __init__(self):
        self.rows: dict[tuple[str, str], collections.Counter] = collections.defaultdict(collections.Counter)
        self.faults: list[dict] = []          # the requests that got INTERNAL, hung or left a stream open
        self.other: list[dict] = []           # answers that were neither a result nor a known error (first 40)

    def add(self, model: str, interface: str, outcome: str, case: Case | None = None, detail: str = "") -> None:
        self.rows[(model, interface)][outcome] += 1
        if outcome == "other" and case is not None and len(self.other) < 40:
            self.other.append({"model": model, "interface": interface, "case": case.kind, "input": case.input,
                               "detail": detail[:300]})
        if outcome in ("INTERNAL", "hang", "stuck_stream") and case is not None:
            self.faults.append({"model": model, "interface": interface, "outcome": outcome, "case": case.kind,
                                "input": case.input, "detail": detail[:300]})


def _code(exc: Exception) -> str:
    status = str(exc.status() or "") if isinstance(exc, InferenceServerException) else ""
    status = status.removeprefix("StatusCode.")
    text = str(exc)
    if "Deadline" in text or "DEADLINE_EXCEEDED" in status or "timed out" in text.lower():
        return "hang"
    return {"400": "INVALID_ARGUMENT", "500": "INTERNAL", "503": "UNAVAILABLE", "404": "NOT_FOUND"}.get(status, status) \
        or ("INTERNAL" if "INTERNAL" in text else "error")


# Triton's and the steps' words for a request they refuse (a stream's error keeps only its text)
_REFUSALS = ("field '", "unexpected", "expected", "expects", "input byte size", "data-type", "shape", "missing")


def _stream_code(text: str) -> str:
    if any(w in text for w in _REFUSALS):
        return "INVALID_ARGUMENT"
    if "retry later" in text or "Exceeds maximum queue size" in text:
        return "UNAVAILABLE"
    return "INTERNAL" if "Error" in text or "Traceback" in text else "other"


def _inputs(module, case: Case) -> list:
    """The case's tensors as `module`'s (tritonclient.grpc or .http) InferInputs, binary on HTTP."""
    out = []
    for t in case.tensors:
        i = module.InferInput(t.name, list(t.data.shape), t.wire)
        i.set_data_from_numpy(t.data)
        out.append(i)
    return out


def _stream_outcome(model: str, case: Case, url: str) -> tuple[str, str]:
    """Over a gRPC stream, as a decoupled model is called: an error, or results up to the final flag."""
    got: queue.Queue = queue.Queue()
    client = grpcclient.InferenceServerClient(url)
    try:
        client.start_stream(callback=lambda result, error: got.put((result, error)))
        client.async_stream_infer(model, _inputs(grpcclient, case), enable_empty_final_response=True)
        deadline = time.monotonic() + DEADLINE_S
        while True:
            try:
                result, error = got.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                return "stuck_stream", "no final response"
            if error is not None:
                # the stream's error keeps only its text (Triton 2.51): sort by what it says
                return _stream_code(str(error)), str(error)
            response = result.get_response()
            if "triton_final_response" in response.parameters and response.parameters["triton_final_response"].bool_param:
                return "ok", ""
    except InferenceServerException as exc:
        return _code(exc), str(exc)
    finally:
        try:
            client.stop_stream(cancel_requests=True)
        except Exception:  # noqa: BLE001
            pass
        client.close()


def _grpc_outcome(model: str, case: Case, url: str) -> tuple[str, str]:
    client = grpcclient.InferenceServerClient(url)
    try:
        client.infer(model, _inputs(grpcclient, case), client_timeout=DEADLINE_S)
        return "ok", ""
    except InferenceServerException as exc:
        return _code(exc), str(exc)
    finally:
        client.close()


def _http_outcome(model: str, case: Case, url: str) -> tuple[str, str]:
    client = httpclient.InferenceServerClient(url, connection_timeout=DEADLINE_S, network_timeout=DEADLINE_S)
    try:
        client.infer(model, _inputs(httpclient, case))
        return "ok", ""
    except InferenceServerException as exc:
        return _code(exc), str(exc)
    except Exception as exc:  # noqa: BLE001 - a socket timeout is a hang
        return ("hang" if "timed out" in str(exc).lower() else "error"), str(exc)
    finally:
        client.close()


def models_and_steps(server: TritonServer) -> list[tuple[str, dict]]:
    client = httpclient.InferenceServerClient(server.http_url)
    try:
        names = sorted(m["name"] for m in client.get_model_repository_index() if m.get("state") == "READY")
        return [(n, client.get_model_config(n)) for n in names]
    finally:
        client.close()


def run_corpus(server: TritonServer, tally: Tally, good: dict = GOOD) -> dict:
    """The corpus against every ready model of `server`, then a good request of each model in `good`."""
    stubs_before = len(stub_models(group_processes(server.proc.pid)))
    started, served_after = time.time(), {}
    for model, config in models_and_steps(server):
        decoupled = bool(config.get("model_transaction_policy", {}).get("decoupled"))
        for case in cases(model, config):
            if decoupled:
                outcome, detail = _stream_outcome(model, case, server.grpc_url)
                tally.add(model, "grpc_stream", outcome, case, detail)
            else:
                outcome, detail = _grpc_outcome(model, case, server.grpc_url)
                tally.add(model, "grpc", outcome, case, detail)
                outcome, detail = _http_outcome(model, case, server.http_url)
                tally.add(model, "http", outcome, case, detail)
        if server.proc.poll() is not None:
            raise RuntimeError(f"tritonserver exited during the corpus of {model}")
    for model, call in good.items():
        try:
            served_after[model] = bool(call(server.grpc_url))
        except Exception as exc:  # noqa: BLE001
            served_after[model] = f"failed: {str(exc)[:200]}"
    for model in server.models or []:
        if model not in good:             # no good request known here: its readiness at least
            served_after[model] = "ready" if model_ready(server.http_url, model) else "NOT READY"
    return {"seconds": round(time.time() - started, 1), "stubs_before": stubs_before,
            "stubs_after": len(stub_models(group_processes(server.proc.pid))),
            "stub_deaths": len(server.watchdog.recoveries), "served_after": served_after}


def engine_gauges(server: TritonServer, model: str = "qwen3_chat_ar") -> dict[str, float]:
    from prometheus_client.parser import text_string_to_metric_families

    text = urllib.request.urlopen(f"http://127.0.0.1:{server.metrics_port}/metrics", timeout=5).read().decode()
    return {s.name.removeprefix("triton_omni_ar_"): s.value for f in text_string_to_metric_families(text)
            for s in f.samples if s.name.startswith("triton_omni_ar_") and s.labels.get("model") == model
            and s.name.removeprefix("triton_omni_ar_") in ("running_seqs", "waiting_seqs", "kv_blocks_used",
                                                            "kv_blocks_total", "free_slots", "refused", "requests_started",
                                                            "requests_finished")}


def idle_gauges(server: TritonServer, timeout: float = 30.0) -> dict[str, float]:
    deadline = time.monotonic() + timeout
    while True:
        g = engine_gauges(server)
        published = g.get("kv_blocks_total", 0) > 0          # a reloaded step's gauges start at 0
        if (published and g["running_seqs"] == 0 and g["waiting_seqs"] == 0) or time.monotonic() > deadline:
            return g
        time.sleep(0.2)


def group_rss_mb(server: TritonServer) -> float:
    total = 0
    for pid in group_processes(server.proc.pid):
        try:
            for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1])
        except OSError:
            pass
    return round(total / 1024, 1)


def run_faults(server: TritonServer) -> list[dict]:
    out = []
    chat = GOOD["qwen3_chat"]
    # 1. a stub killed as the out-of-memory killer kills it; another model is called meanwhile
    for model, owner in (("qwen3_chat_ar", "qwen3_chat"), ("kokoro_tts_synth", "kokoro_tts")):
        pids = [p for p, m in stub_models(group_processes(server.proc.pid)).items() if m == model]
        t0 = time.time()
        os.kill(pids[0], signal.SIGKILL)
        saw_not_ready, others_ok = False, 0
        while time.time() - t0 < 180:
            ready = model_ready(server.http_url, model)
            saw_not_ready |= not ready
            if saw_not_ready and ready:
                break
            others_ok += _try(GOOD["z_image_turbo"], server.grpc_url) is True
        out.append({"fault": f"SIGKILL of the {model} stub", "reported_not_ready": saw_not_ready,
                    "ready_again_s": round(time.time() - t0, 1), "z_image_turbo_requests_ok_meanwhile": others_ok,
                    "served_after": _try(GOOD[owner], server.grpc_url)})
    # 2. clients that vanish mid-stream
    def vanish(_):
        replies = ChatClient(server.grpc_url, 120).stream("qwen3_chat", messages=[{"role": "user", "content": "Hi"}],
                                                          sampling={"max_tokens": 400, "ignore_eos": True})
        next(replies), next(replies)
        replies.close()
    clients = CHAT_SLOTS + CHAT_WAITING          # as many as the engine takes: none refused
    with ThreadPoolExecutor(clients) as pool:
        list(pool.map(vanish, range(clients)))
    g = idle_gauges(server)
    out.append({"fault": f"{clients} clients closing their chat streams after 2 chunks",
                "running_seqs": g.get("running_seqs"),
                "kv_blocks_used": g.get("kv_blocks_used"), "free_slots": g.get("free_slots"),
                "served_after": _try(chat, server.grpc_url)})
    # 3. a model unloaded while its streams run
    results = []
    def long_stream():
        results.append(_try(lambda u: ChatClient(u, 120).complete(
            "qwen3_chat", messages=[{"role": "user", "content": "Hi"}],
            sampling={"max_tokens": 300, "ignore_eos": True}).finish_reason, server.grpc_url))
    threads = [threading.Thread(target=long_stream) for _ in range(3)]
    [t.start() for t in threads]
    time.sleep(0.5)
    base = f"http://{server.http_url}/v2/repository/models/qwen3_chat_ar"
    urllib.request.urlopen(urllib.request.Request(f"{base}/unload", b"{}", method="POST"), timeout=120)
    [t.join(timeout=180) for t in threads]
    hung = sum(t.is_alive() for t in threads)
    not_ready = not model_ready(server.http_url, "qwen3_chat_ar")
    urllib.request.urlopen(urllib.request.Request(f"{base}/load", b"{}", method="POST"), timeout=300)
    out.append({"fault": "qwen3_chat_ar unloaded while 3 streams ran", "streams_answered": results,
                "streams_hung": hung, "reported_not_ready": not_ready, "served_after": _try(chat, server.grpc_url)})
    return out


def _try(call, url) -> object:
    try:
        return call(url)
    except Exception as exc:  # noqa: BLE001
        return f"failed: {str(exc)[:200]}"


def run_overload(server: TritonServer) -> dict:
    """4x the chat engine's bounds at once (CHAT_SLOTS running + CHAT_WAITING queued)."""
    n = 4 * (CHAT_SLOTS + CHAT_WAITING)
    start = threading.Event()

    def one(_):
        start.wait()
        t0 = time.perf_counter()
        try:
            ChatClient(server.grpc_url, 120).complete("qwen3_chat", messages=[{"role": "user", "content": "Hi"}],
                                                      sampling={"max_tokens": 64, "ignore_eos": True})
            return "ok", time.perf_counter() - t0
        except Exception as exc:  # noqa: BLE001
            return ("refused" if "retry later" in str(exc) else "error"), time.perf_counter() - t0
    with ThreadPoolExecutor(n) as pool:
        futures = [pool.submit(one, i) for i in range(n)]
        start.set()
        done = [f.result(timeout=300) for f in futures]
    kinds = collections.Counter(k for k, _ in done)
    refused = [t for k, t in done if k == "refused"]
    return {"requests": n, **kinds, "refusal_p100_ms": round(max(refused) * 1e3, 1) if refused else None,
            "ok_p100_ms": round(max(t for k, t in done if k == "ok") * 1e3, 1),
            "served_after": _try(GOOD["qwen3_chat"], server.grpc_url), "gauges_after": idle_gauges(server)}


def run_soak(server: TritonServer, minutes: float, workers: int = 4) -> dict:
    """`workers` threads calling the models in turn for `minutes`; memory and gauges before and after."""
    idle_gauges(server)
    deaths_before = len(server.watchdog.recoveries)       # the faults' own kills came before
    before = {"rss_mb": group_rss_mb(server), "gauges": engine_gauges(server)}
    stop_at, counts, errors = time.monotonic() + minutes * 60, collections.Counter(), collections.Counter()
    rss_trace = []

    def worker(i):
        names = MODELS[i % len(MODELS):] + MODELS[:i % len(MODELS)]
        k = 0
        while time.monotonic() < stop_at:
            name = names[k % len(names)]
            k += 1
            try:
                ok = GOOD[name](server.grpc_url)
                counts[name] += 1
                if not ok:                # an answer the check finds wrong (e.g. no tokens), not an error raised
                    errors[f"{name}: answered, check failed"] += 1
            except Exception as exc:  # noqa: BLE001
                errors[f"{name}: {_code(exc) if isinstance(exc, InferenceServerException) else type(exc).__name__}"] += 1

    threads = [threading.Thread(target=worker, args=(i,), daemon=True) for i in range(workers)]
    [t.start() for t in threads]
    while any(t.is_alive() for t in threads):
        rss_trace.append((round((time.monotonic() - stop_at) / 60 + minutes, 2), group_rss_mb(server)))
        time.sleep(30)
    [t.join() for t in threads]
    after = {"rss_mb": group_rss_mb(server), "gauges": idle_gauges(server)}
    return {"minutes": minutes, "workers": workers, "requests": dict(counts), "errors": dict(errors),
            "before": before, "after": after, "rss_trace": rss_trace,
            "stub_deaths": len(server.watchdog.recoveries) - deaths_before}


def write_report(data: dict, tally: Tally) -> None:
    codes = sorted({c for counter in tally.rows.values() for c in counter})
    lines = ["# Reliability", "", f"Command: `{data['command']}`", "",
             f"Machine: {data['machine']}; {data['date']}; tiny random checkpoints on the CPU, loopback only.", "",
             "## Bad requests to every model and internal step",
             "", "Each model gets the corpus of perf_analyzer_configs/reliability/corpus.py (missing, extra, wrong dtype "
             "and rank, empty, oversized, NaN/inf, negative and absurd numbers, invalid UTF-8, broken media), over "
             "gRPC and HTTP (gRPC streams for decoupled models). `ok`: a result; the rest are error codes. "
             "Faults: INTERNAL, hang, stuck_stream.", "",
             "| model | interface | requests | " + " | ".join(codes) + " |",
             "|---|---|---:|" + "---:|" * len(codes)]
    for (model, interface), counter in sorted(tally.rows.items()):
        lines.append(f"| {model} | {interface} | {sum(counter.values())} | "
                     + " | ".join(str(counter.get(c, 0)) for c in codes) + " |")
    total = collections.Counter()
    for counter in tally.rows.values():
        total.update(counter)
    runs = [data["corpus"], *data.get("groups", [])]
    after = {m: v for r in runs for m, v in r["served_after"].items()}
    lines += ["", f"In all: {sum(total.values())} requests in {sum(r['seconds'] for r in runs):.0f} s over "
              f"{len(runs)} server runs; INTERNAL {total.get('INTERNAL', 0)}, hangs {total.get('hang', 0)}, "
              f"stuck streams {total.get('stuck_stream', 0)}, stub deaths {sum(r['stub_deaths'] for r in runs)}, "
              f"server exits 0. Afterwards (a good request where the script has one, else readiness): "
              + ", ".join(f"{m} {v}" for m, v in sorted(after.items())) + ".", ""]
    if tally.other:
        lines += [f"Answers of no known kind ('other'; {len(tally.other)} kept in the JSON), e.g.: "
                  + "; ".join(f"{o['model']}/{o['case']}/{o['input']}: {o['detail'][:100]}" for o in tally.other[:3]), ""]
    if tally.faults:
        lines += ["Requests counted as faults (first 40):", "", "| model | interface | outcome | case | input | detail |",
                  "|---|---|---|---|---|---|"]
        lines += [f"| {f['model']} | {f['interface']} | {f['outcome']} | {f['case']} | {f['input']} | "
                  f"{f['detail'][:120].replace('|', '/').replace(chr(10), ' ')} |" for f in tally.faults[:40]]
        lines.append("")
    lines += ["## Faults injected", "", "| fault | what happened |", "|---|---|"]
    for f in data["faults"]:
        lines.append(f"| {f['fault']} | " + ", ".join(f"{k}: {v}" for k, v in f.items() if k != "fault") + " |")
    o = data["overload"]
    lines += ["", "## Overload", "", f"{o['requests']} chat requests at once against {CHAT_SLOTS} decode slots and "
              f"{CHAT_WAITING} queue places (4x): ok {o.get('ok', 0)}, refused at once (UNAVAILABLE) "
              f"{o.get('refused', 0)}, other errors {o.get('error', 0)}; slowest refusal {o['refusal_p100_ms']} ms, "
              f"slowest answer {o['ok_p100_ms']} ms; served after: {o['served_after']}; engine after: "
              f"{o['gauges_after']}.", ""]
    s = data.get("soak")
    if s:
        lines += ["## Soak", "", f"{s['minutes']} minutes, {s['workers']} clients calling {', '.join(MODELS)} in turn: "
                  f"requests {s['requests']}, errors {s['errors'] or 0}, stub deaths {s['stub_deaths']}.", "",
                  f"Memory of tritonserver and its stubs (RSS): {s['before']['rss_mb']} MB before, "
                  f"{s['after']['rss_mb']} MB after; trace (minute, MB): {s['rss_trace']}.", "",
                  f"Chat engine before: {s['before']['gauges']}; after: {s['after']['gauges']}.", ""]
    else:
        lines += ["## Soak", "", "Not run this time (`--soak-minutes 30` runs it).", ""]
    (RESULTS / "reliability.md").write_text("\n".join(lines) + "\n")
    (RESULTS / "reliability.json").write_text(json.dumps(
        {**data, "corpus_rows": {f"{m}|{i}": dict(c) for (m, i), c in tally.rows.items()},
         "corpus_faults": tally.faults, "corpus_other": tally.other}, indent=1, default=str) + "\n")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m perf_analyzer_configs.reliability.run")
    ap.add_argument("--soak-minutes", type=float, default=0.0)
    ap.add_argument("--workdir", type=Path, default=ROOT / "outputs" / "reliability")
    ap.add_argument("--skip-corpus", action="store_true")
    ap.add_argument("--main-only", action="store_true", help=f"the corpus of {', '.join(MODELS)} only")
    args = ap.parse_args(argv)
    args.workdir.mkdir(parents=True, exist_ok=True)
    repo = args.workdir / "model_repository"
    write_repository(load_configs(MODELS, [], OVERRIDES), repo, "cpu")
    import platform

    data = {"command": "python -m perf_analyzer_configs.reliability.run"
            + (f" --soak-minutes {args.soak_minutes:g}" if args.soak_minutes else ""),
            "machine": f"{platform.machine()}, {os.cpu_count()} cores", "date": time.strftime("%Y-%m-%d")}
    tally = Tally()
    groups = [] if args.skip_corpus or args.main_only else GROUPS
    data["groups"] = []
    for i, models in enumerate(groups):
        repo_i = args.workdir / f"model_repository_{i}"
        write_repository(load_configs(models, [], []), repo_i, "cpu")
        with TritonServer(repo_i, models=models, log_path=args.workdir / f"tritonserver_{i}.log") as server:
            data["groups"].append(run_corpus(server, tally, {}))
        print("group done", models, data["groups"][-1], flush=True)
    with TritonServer(repo, models=MODELS, log_path=args.workdir / "tritonserver.log") as server:
        data["corpus"] = run_corpus(server, tally) if not args.skip_corpus else {
            "seconds": 0, "stub_deaths": 0, "served_after": {}}
        print("corpus done", data["corpus"], flush=True)
        data["overload"] = run_overload(server)
        print("overload done", data["overload"], flush=True)
        data["faults"] = run_faults(server)
        print("faults done", data["faults"], flush=True)
        if args.soak_minutes:
            data["soak"] = run_soak(server, args.soak_minutes)
    write_report(data, tally)
    print(f"wrote {RESULTS / 'reliability.md'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
