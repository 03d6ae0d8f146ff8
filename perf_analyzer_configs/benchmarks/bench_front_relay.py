"""How many streamed responses a streaming model's front relays, on any machine (no GPU needed).

A toy ensemble stands in for a model: `toy_stream`, a decoupled python model that, like the AR
engine, runs a "step" every --step-ms and sends one token (a 1-element INT32 `OUT`) to every live
stream; `toy_post`, a pass-through step after it (as the detokenizer); `toy_ens`, the ensemble; and
`toy_front`, the front (python_backends/runtime/front.py, or the class named by --front, e.g. a
variant under test in a file of its own). Clients keep --concurrency gRPC streams of --tokens tokens busy for --seconds
and count tokens received (a front that merges responses sends several per response), after a
warm-up that lasts until the first request has ended.

    python -m perf_analyzer_configs.benchmarks.bench_front_relay          # toy_ens and toy_front
    python -m perf_analyzer_configs.benchmarks.bench_front_relay --front /tmp/my_front.py:MyFront --models toy_front

Prints one JSON line per model: tokens/s, responses/s. On a 2-core machine the toy itself is
CPU-bound, so compare the front against the ensemble called directly in the same run.
"""
from __future__ import annotations

import argparse
import json
import queue
import sys
import tempfile
import textwrap
import threading
import time
from pathlib import Path

# The models' code runs in Triton's python stubs, which run this environment's python: triton_omni is
# installed there, and a front under test that is not a module of it is loaded from its file.
STREAM_MODEL = '''
import queue, threading, time
import numpy as np
import triton_python_backend_utils as pb
from triton_omni.runtime.triton_model import STUB_LOCK

class TritonPythonModel:
    def initialize(self, args):
        self.new, self.live = queue.SimpleQueue(), []
        threading.Thread(target=self.loop, daemon=True).start()

    def execute(self, requests):
        for r in requests:
            with STUB_LOCK:
                n = pb.get_input_tensor_by_name(r, "N")
                sender = r.get_response_sender()
                if n is None:                 # the front's abort request: nothing to abort here
                    sender.send(flags=pb.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
                    continue
                self.new.put([sender, int(n.as_numpy()[0]), 0])
        return None

    def loop(self):
        while True:
            if not self.live:
                self.live.append(self.new.get())
            while not self.new.empty():
                self.live.append(self.new.get())
            time.sleep({step_s})
            for entry in self.live:
                entry[2] += 1
                final = entry[2] >= entry[1]
                with STUB_LOCK:
                    out = pb.Tensor("TOK", np.array([entry[2]], np.int32))
                    try:
                        entry[0].send(pb.InferenceResponse(output_tensors=[out]),
                                      flags=pb.TRITONSERVER_RESPONSE_COMPLETE_FINAL if final else 0)
                    except Exception:         # its client cancelled: drop the stream
                        entry[2] = entry[1]
            self.live = [e for e in self.live if e[2] < e[1]]
'''
POST_MODEL = '''
import triton_python_backend_utils as pb

class TritonPythonModel:
    def execute(self, requests):
        return [pb.InferenceResponse(output_tensors=[pb.Tensor("OUT", pb.get_input_tensor_by_name(r, "TOK").as_numpy())])
                for r in requests]
'''
FRONT_MODEL = '''
import importlib, importlib.util
module, name = {front!r}.rsplit(":", 1)
if module.endswith(".py"):                 # a file: loaded as a module of its own, no search path needed
    spec = importlib.util.spec_from_file_location("front_under_test", module)
    found = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(found)
else:
    found = importlib.import_module(module)
TritonPythonModel = getattr(found, name)
'''
CONFIGS = {
    "toy_stream": '''
        backend: "python"
        model_transaction_policy {{ decoupled: true }}
        input [ {{ name: "N" data_type: TYPE_INT32 dims: [1] optional: true }},
                {{ name: "abort_request_id" data_type: TYPE_STRING dims: [1] optional: true }} ]
        output [ {{ name: "TOK" data_type: TYPE_INT32 dims: [-1] }} ]
        instance_group [ {{ kind: KIND_CPU count: 1 }} ]''',
    "toy_post": '''
        backend: "python"
        input [ {{ name: "TOK" data_type: TYPE_INT32 dims: [-1] }} ]
        output [ {{ name: "OUT" data_type: TYPE_INT32 dims: [-1] }} ]
        instance_group [ {{ kind: KIND_CPU count: 1 }} ]''',
    "toy_ens": '''
        platform: "ensemble"
        input [ {{ name: "N" data_type: TYPE_INT32 dims: [1] }} ]
        output [ {{ name: "OUT" data_type: TYPE_INT32 dims: [-1] }} ]
        ensemble_scheduling {{ step [
          {{ model_name: "toy_stream" model_version: -1 input_map {{ key: "N" value: "N" }}
             output_map {{ key: "TOK" value: "tok" }} }},
          {{ model_name: "toy_post" model_version: -1 input_map {{ key: "TOK" value: "tok" }}
             output_map {{ key: "OUT" value: "OUT" }} }} ] }}''',
    "toy_front": '''
        backend: "python"
        model_transaction_policy {{ decoupled: true }}
        input [ {{ name: "N" data_type: TYPE_INT32 dims: [1] }} ]
        output [ {{ name: "OUT" data_type: TYPE_INT32 dims: [-1] }} ]
        instance_group [ {{ kind: KIND_CPU count: {fronts} }} ]
        parameters {{ key: "ensemble" value: {{ string_value: "toy_ens" }} }}
        parameters {{ key: "abort_models" value: {{ string_value: "toy_stream" }} }}''',
}


def write_repository(folder: Path, args) -> None:
    code = {"toy_stream": STREAM_MODEL.format(step_s=args.step_ms / 1e3), "toy_post": POST_MODEL,
            "toy_front": FRONT_MODEL.format(front=args.front)}
    for name, config in CONFIGS.items():
        (folder / name / "1").mkdir(parents=True, exist_ok=True)
        text = f'name: "{name}"\nmax_batch_size: 0\n' + textwrap.dedent(config.format(fronts=args.fronts)).strip()
        (folder / name / "config.pbtxt").write_text(text + "\n")
        if name in code:
            (folder / name / "1" / "model.py").write_text(code[name])


def measure(url: str, model: str, args) -> dict:
    """Closed loop: --concurrency requests in flight on one gRPC stream, a new one when one ends."""
    import numpy as np
    import tritonclient.grpc as grpcclient

    from triton_omni.client.triton import is_final_response

    client = grpcclient.InferenceServerClient(url)
    counts, lock, finished = {"tokens": 0, "responses": 0, "errors": 0}, threading.Lock(), queue.SimpleQueue()

    def on_response(result, error):
        if error is not None:
            with lock:
                counts["errors"] += 1
            finished.put(1)
            return
        out = result.as_numpy("OUT")
        with lock:
            counts["tokens"] += 0 if out is None else out.shape[0]
            counts["responses"] += out is not None
        if is_final_response(result.get_response()):
            finished.put(1)

    client.start_stream(callback=on_response)
    tokens = grpcclient.InferInput("N", [1], "INT32")
    tokens.set_data_from_numpy(np.array([args.tokens], np.int32))
    sent = 0

    def send():
        nonlocal sent
        sent += 1
        client.async_stream_infer(model, [tokens], request_id=str(sent), enable_empty_final_response=True)

    def snapshot():
        with lock:
            return time.monotonic(), counts["tokens"], counts["responses"], counts["errors"]

    for _ in range(args.concurrency):
        send()
    # warm-up: until the first request has ended and at least a second has passed; the window then
    # runs from a request's end until the first end after --seconds, so a run shorter than one
    # request (64 streams of 256 tokens on two cores take seconds) still measures whole requests
    start = time.monotonic()
    while True:
        finished.get()
        send()
        if time.monotonic() - start > 1.0:
            break
    warm = snapshot()
    while time.monotonic() - warm[0] < args.seconds:
        finished.get()
        send()
    end = snapshot()
    errors = end[3]                            # stopping the stream below cancels what is in flight
    client.stop_stream(cancel_requests=True)
    client.close()
    span = end[0] - warm[0]
    return {"model": model, "concurrency": args.concurrency, "fronts": args.fronts, "front": args.front,
            "tokens_per_s": round((end[1] - warm[1]) / span), "responses_per_s": round((end[2] - warm[2]) / span),
            "errors": errors}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", nargs="+", default=["toy_ens", "toy_front"], choices=["toy_ens", "toy_front"])
    ap.add_argument("--front", default="triton_omni.runtime.front:StreamFront",
                    help="the front's class: module:Class, or FILE.py:Class for a variant in a file of its own")
    ap.add_argument("--fronts", type=int, default=1, help="front processes (instance count)")
    ap.add_argument("--concurrency", type=int, default=64)
    ap.add_argument("--tokens", type=int, default=256, help="tokens per request")
    ap.add_argument("--step-ms", type=float, default=2.0, help="the toy engine's step time")
    ap.add_argument("--seconds", type=float, default=10.0)
    args = ap.parse_args()
    module, _, cls = args.front.rpartition(":")
    if module.endswith(".py"):               # the stub runs elsewhere: the file by its absolute path
        args.front = f"{Path(module).resolve()}:{cls}"

    from triton_omni.launcher.triton import TritonServer

    with tempfile.TemporaryDirectory() as tmp:
        repo = Path(tmp) / "repository"
        write_repository(repo, args)
        server = TritonServer(repo, models=["toy_front", "toy_ens"], log_path=Path(tmp) / "server.log")
        server.start(timeout=300)
        try:
            for model in args.models:
                try:
                    print(json.dumps(measure(server.grpc_url, model, args)), flush=True)
                except Exception as exc:  # noqa: BLE001 - a broken stream: the front (or the toy) failed
                    print(json.dumps({"model": model, "front": args.front, "failed": str(exc)[:300]}), flush=True)
        finally:
            server.stop()
            log = (Path(tmp) / "server.log").read_text(errors="replace")
            for marker in ("malloc", "Segmentation fault", "corrupt", "Reference count"):
                if marker in log:
                    print(f"server log: {marker!r} found: a stub crashed", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
