"""Bring a model back when its python-backend stub dies.

Triton 2.51's python backend does not restart a stub that died (killed by the kernel for its memory,
a segfault in a native library): every later request of that model fails with "Stub process ... is
not healthy" while `/v2/health/ready` and the model's own ready endpoint still answer 200. The
watchdog, a thread beside the server it launched, polls the server's process group; when the stub of
a model that Triton still calls ready is gone, it unloads the model (the model's ready endpoint turns
false) and loads it again (a fresh stub), through Triton's repository API. The ensemble that uses it
serves again once its step is back. Needs explicit model control (the launcher always asks for it).
"""
from __future__ import annotations

import logging
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

log = logging.getLogger("triton_omni.watchdog")
STUB = "triton_python_backend_stub"


def stub_models(processes: dict[int, list[str]]) -> dict[int, str]:
    """pid -> model name of each stub (its argv[1] is <repository>/<model>/<version>/model.py)."""
    return {pid: Path(argv[1]).parent.parent.name for pid, argv in processes.items()
            if argv and argv[0].endswith(STUB) and len(argv) > 1}


def _post(url: str, timeout: float) -> None:
    request = urllib.request.Request(url, data=b"{}", method="POST", headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=timeout):
        pass


def model_ready(http_url: str, model: str) -> bool:
    try:
        with urllib.request.urlopen(f"http://{http_url}/v2/models/{model}/ready", timeout=5) as r:
            return r.status == 200
    except (urllib.error.URLError, OSError):
        return False


@dataclass
class Recovery:
    model: str
    died_at: float
    ready_again_at: float | None = None
    error: str | None = None


@dataclass
class StubWatchdog:
    """Started by `TritonServer.start()` / `run_foreground()`; `recoveries` records what it did."""

    processes: Callable[[], dict[int, list[str]]]        # the server's process group, pid -> argv
    http_url: str
    interval_s: float = 0.5
    load_timeout_s: float = 300.0
    recoveries: list[Recovery] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._stop = threading.Event()
        self._busy: set[str] = set()           # models being reloaded by us: their stubs come and go
        self._thread = threading.Thread(target=self._run, name="stub-watchdog", daemon=True)

    def start(self) -> "StubWatchdog":
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive() and threading.current_thread() is not self._thread:
            self._thread.join(timeout=5)

    def _run(self) -> None:
        seen = stub_models(self.processes())
        while not self._stop.wait(self.interval_s):
            now = stub_models(self.processes())
            # any instance's stub gone: the dead instance would still get its share of the requests
            gone = {m for pid, m in seen.items() if pid not in now and m not in self._busy}
            for model in sorted(gone):
                if not self._stop.is_set() and model_ready(self.http_url, model):
                    # ready, with a stub gone: a crash (an unload makes the model not ready first)
                    self._busy.add(model)
                    threading.Thread(target=self._recover, args=(model,), daemon=True).start()
            seen = now

    def _recover(self, model: str) -> None:
        record = Recovery(model, time.time())
        self.recoveries.append(record)
        log.warning("the stub of model %r died; reloading it", model)
        base = f"http://{self.http_url}/v2/repository/models/{model}"
        try:
            _post(f"{base}/unload", timeout=60)
            deadline = time.monotonic() + 60
            while model_ready(self.http_url, model) and time.monotonic() < deadline:
                time.sleep(0.1)
            _post(f"{base}/load", timeout=self.load_timeout_s)
            record.ready_again_at = time.time() if model_ready(self.http_url, model) else None
            log.warning("model %r reloaded after its stub died", model)
        except (urllib.error.URLError, OSError) as exc:
            record.error = str(exc)
            log.error("reloading model %r failed: %s", model, exc)
        finally:
            self._busy.discard(model)
