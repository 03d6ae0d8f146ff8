"""Running Triton's perf_analyzer 2.51 from this environment, and reading its numbers.

The binary comes with the tritonclient==2.51.0 wheel (pip puts it in the environment's bin/). It
links `libb64.so.0d` and `libcudart.so.12`; the nvidia-pytriton wheel carries both, under hashed
names (auditwheel), in its `nvidia_pytriton.libs` folder. `library_dir()` makes a folder of
symlinks with the plain names for LD_LIBRARY_PATH. (The PyPI `perf-analyzer` wheels need glibc
2.38, hence this one.)
"""
from __future__ import annotations

import csv
import io
import os
import shutil
import subprocess
import sys
import sysconfig
from dataclasses import dataclass
from pathlib import Path

NEEDED = {"libb64.so.0d": "libb64-*.so.0d", "libcudart.so.12": "libcudart-*.so.12*"}


def binary() -> Path:
    here = Path(sys.executable).parent / "perf_analyzer"
    found = here if here.exists() else shutil.which("perf_analyzer")
    if not found:
        raise FileNotFoundError("perf_analyzer not found: it comes with tritonclient==2.51.0 "
                                "(pip install 'tritonclient[all]==2.51.0' puts it in the environment's bin/)")
    return Path(found)


def library_dir() -> Path:
    """`<env>/share/triton_omni/perf_analyzer_libs`: symlinks with the names perf_analyzer asks for."""
    libs = Path(sysconfig.get_paths()["platlib"]) / "nvidia_pytriton.libs"
    out = Path(sys.prefix) / "share" / "triton_omni" / "perf_analyzer_libs"
    out.mkdir(parents=True, exist_ok=True)
    for name, pattern in NEEDED.items():
        matches = sorted(libs.glob(pattern))
        if not matches:
            raise FileNotFoundError(f"{pattern} not in {libs}: is nvidia-pytriton==0.7.0 installed?")
        link = out / name
        if link.is_symlink() and link.resolve() != matches[0].resolve():
            link.unlink()
        if not link.exists():
            link.symlink_to(matches[0])
    return out


def environment() -> dict[str, str]:
    env = dict(os.environ)
    env["LD_LIBRARY_PATH"] = os.pathsep.join(p for p in (str(library_dir()), env.get("LD_LIBRARY_PATH")) if p)
    return env


def version() -> str:
    out = subprocess.run([str(binary()), "--version"], env=environment(), capture_output=True, text=True)
    return (out.stdout or out.stderr).strip().splitlines()[0] if (out.stdout or out.stderr) else "unknown"


@dataclass
class Settings:
    measurement_ms: int = 3000
    max_trials: int = 5              # perf_analyzer needs at least 3 windows to judge stability
    stability_percent: float = 10.0
    # > 0: windows that last until this many requests have completed (perf_analyzer's count_windows),
    # for models that take seconds a request on a small machine (a time window may then see none)
    measurement_requests: int = 0


def command(model: str, url: str, input_json: Path, csv_path: Path, concurrency: int, settings: Settings,
            streaming: bool) -> list[str]:
    """perf_analyzer over gRPC at one concurrency; a streaming (decoupled) model needs --streaming."""
    cmd = [str(binary()), "-m", model, "-u", url, "-i", "grpc", "--input-data", str(input_json),
           "--concurrency-range", str(concurrency), "--measurement-interval", str(settings.measurement_ms),
           "--max-trials", str(max(3, settings.max_trials)), "--stability-percentage", f"{settings.stability_percent:g}",
           "-f", str(csv_path), "--verbose-csv"]
    if settings.measurement_requests > 0:
        cmd += ["--measurement-mode", "count_windows", "--measurement-request-count", str(settings.measurement_requests)]
    return cmd + (["--streaming"] if streaming else [])


def run(model: str, url: str, input_json: Path, csv_path: Path, concurrency: int, settings: Settings,
        streaming: bool, timeout_s: float = 1800) -> tuple[list[dict], str, list[str]]:
    """Run once; returns (rows parsed from the CSV, console output, command)."""
    cmd = command(model, url, input_json, csv_path, concurrency, settings, streaming)
    csv_path.unlink(missing_ok=True)
    try:
        proc = subprocess.run(cmd, env=environment(), capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired as e:
        # perf_analyzer waits for every request it sent: a request that never ends hangs it.
        out = e.stdout.decode(errors="replace") if isinstance(e.stdout, bytes) else (e.stdout or "")
        tail = "\n".join(out.strip().splitlines()[-10:])
        raise RuntimeError(f"perf_analyzer on {model} did not finish in {timeout_s:.0f} s (a request that never "
                           f"completed? check the server log):\n{tail}") from None
    console = proc.stdout + proc.stderr
    if proc.returncode != 0 or not csv_path.exists():
        tail = "\n".join(console.strip().splitlines()[-15:])
        raise RuntimeError(f"perf_analyzer failed on {model} (exit {proc.returncode}):\n{tail}")
    return parse_csv(csv_path.read_text()), console, cmd


# CSV column -> our key; latencies in the CSV are microseconds
COLUMNS = {"Concurrency": "concurrency", "Inferences/Second": "throughput_per_s",
           "Response Throughput": "response_throughput_per_s", "Avg latency": "avg_latency_us",
           "p50 latency": "p50_latency_us", "p90 latency": "p90_latency_us", "p95 latency": "p95_latency_us",
           "p99 latency": "p99_latency_us", "Server Queue": "server_queue_us",
           "Server Compute Infer": "server_compute_infer_us"}


def parse_csv(text: str) -> list[dict]:
    """The per-concurrency rows of `perf_analyzer -f out.csv` (its first table; the verbose CSV
    may append other sections after a blank line)."""
    table = text.split("\n\n")[0]
    rows = []
    for raw in csv.DictReader(io.StringIO(table)):
        row = {}
        for column, key in COLUMNS.items():
            value = (raw.get(column) or "").strip()
            if value:
                row[key] = int(value) if key == "concurrency" else float(value)
        if "concurrency" in row:
            rows.append(row)
    return rows
