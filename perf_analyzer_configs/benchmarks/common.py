"""What the benchmarks share: percentiles, the machine's name and versions, a tritonserver serving one
ensemble, and handing a mode's device memory back before the next mode."""
from __future__ import annotations

import gc
import importlib.metadata
import platform
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]        # the repository's root (ensemble_configs/, .venv*)


def percentile(values, q):
    values = sorted(values)
    return values[min(len(values) - 1, int(round(q * (len(values) - 1))))]


def device_name() -> str:
    import torch

    return torch.cuda.get_device_name(0) if torch.cuda.is_available() else platform.processor() or "cpu"


def versions(*packages: str) -> dict[str, str]:
    """torch's and Python's versions, then those of `packages` that are installed."""
    import torch

    out = {"torch": torch.__version__, "python": platform.python_version()}
    for name in packages:
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            pass
    return out


def start_server(model: str, checkpoint: Path, overrides: list[str], workdir: Path, target: str,
                 extra_args=(), timeout: float = 1800):
    """tritonserver serving ensemble_configs/<model>.yaml on `checkpoint` with converter `overrides`;
    its repository under `workdir`, and one log per start (a later start must not overwrite the log
    of a failed one)."""
    from triton_omni.converters.__main__ import load_configs
    from triton_omni.converters.generate import write_repository
    from triton_omni.launcher.triton import TritonServer

    repo = Path(workdir) / f"repository-{model}"
    write_repository(load_configs([model], [f"{model}={checkpoint}"], list(overrides)), repo, target)
    log = Path(workdir) / f"server-{model}-{time.strftime('%Y%m%d-%H%M%S')}.log"
    print(f"tritonserver log: {log}", flush=True)
    return TritonServer(repo, models=[model], log_path=log, extra_args=list(extra_args)).start(timeout=timeout)


def release_memory() -> None:
    """After a mode: its models and caches are gone, and the device memory they held is free again."""
    import torch

    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
