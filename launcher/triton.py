"""Find and start the real tritonserver for a model repository.

Two installs are supported:
- the server that the `nvidia-pytriton` wheel ships (tritonserver 2.51.0) in this Python environment;
  its python backend needs the stub that matches this interpreter next to `libtriton_python.so`,
  so `prepare_backend_dir()` builds such a folder inside the environment;
- a `tritonserver` already on PATH (the NGC container), with its own backends.

Whichever runs, the python-backend stubs must use *this* environment: the stub ignores PYTHONPATH
and runs the first `python3` on PATH, so this environment's `bin/` goes first on PATH, and the
directory holding `libpython3.X.so` goes on LD_LIBRARY_PATH (else the OS copy is loaded).
"""
from __future__ import annotations

import importlib.util
import os
import shutil
import signal
import socket
import subprocess
import sys
import sysconfig
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

PY_MINOR = f"{sys.version_info.major}.{sys.version_info.minor}"


@dataclass(frozen=True)
class ServerInstall:
    binary: Path
    backend_dir: Path
    lib_dirs: tuple[Path, ...] = ()


def _pytriton_root() -> Path | None:
    """The server tree of the nvidia-pytriton wheel importable here (found, not imported)."""
    spec = importlib.util.find_spec("pytriton")
    for folder in (spec.submodule_search_locations or []) if spec else []:
        root = Path(folder) / "tritonserver"
        if (root / "bin" / "tritonserver").exists():
            return root
    return None


def prepare_backend_dir() -> Path:
    """Make `<env>/share/triton_omni/backends/python` with the stub for this Python (idempotent)."""
    root = _pytriton_root()
    if root is None:
        raise RuntimeError("nvidia-pytriton is not installed in this environment (run scripts/setup.sh)")
    out = Path(sys.prefix) / "share" / "triton_omni" / "backends" / "python"
    stub_src = root / "python_backend_stubs" / PY_MINOR / "triton_python_backend_stub"
    if not stub_src.exists():
        raise RuntimeError(f"the server wheel has no python backend stub for Python {PY_MINOR}")
    out.mkdir(parents=True, exist_ok=True)
    for src in (root / "backends" / "python" / "libtriton_python.so",
                root / "backends" / "python" / "triton_python_backend_utils.py", stub_src):
        dst = out / src.name
        if not dst.exists() or dst.stat().st_size != src.stat().st_size:
            shutil.copy2(src, dst)
    return out.parent


def find_install() -> ServerInstall:
    """The wheel's server if present, else a `tritonserver` on PATH (NGC image layout)."""
    root = _pytriton_root()
    if root is not None:
        libs = root.parent.parent / "nvidia_pytriton.libs"
        return ServerInstall(root / "bin" / "tritonserver", prepare_backend_dir(), (libs,))
    found = shutil.which("tritonserver")
    if found:
        binary = Path(found).resolve()
        return ServerInstall(binary, Path(os.environ.get("TRITON_BACKEND_DIR", binary.parent.parent / "backends")))
    raise RuntimeError("no tritonserver found: install nvidia-pytriton==0.7.0 or use the NGC Triton image")


def libpython_dir() -> Path | None:
    """A folder holding only this interpreter's libpython (a link), for LD_LIBRARY_PATH. Not LIBDIR
    itself: for a system Python that is /usr/lib/<arch>, and everything there (an older cuDNN, say)
    would then shadow the libraries torch ships in the stubs (cuDNN refused to run LSTMs that way)."""
    libdir, name = sysconfig.get_config_var("LIBDIR"), sysconfig.get_config_var("INSTSONAME")
    if not libdir or not name or not (Path(libdir) / name).exists():
        return None
    out = Path(sys.prefix) / "share" / "triton_omni" / "libpython"
    out.mkdir(parents=True, exist_ok=True)
    link = out / name
    if not link.is_symlink() or link.resolve() != (Path(libdir) / name).resolve():
        link.unlink(missing_ok=True)
        link.symlink_to(Path(libdir) / name)
    return out


def server_env(install: ServerInstall) -> dict[str, str]:
    env = dict(os.environ)
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    lib_dirs = [str(p) for p in install.lib_dirs] + [str(libpython_dir() or "")]
    if env.get("LD_LIBRARY_PATH"):
        lib_dirs.append(env["LD_LIBRARY_PATH"])
    env["LD_LIBRARY_PATH"] = os.pathsep.join(d for d in lib_dirs if d)
    env["PYTHONUNBUFFERED"] = "1"
    return env


def has_gpu() -> bool:
    return Path("/dev/nvidia0").exists() or Path("/dev/nvidiactl").exists()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class TritonServer:
    """A running tritonserver process. Use as a context manager; `stop()` leaves no stub behind."""

    model_repository: Path
    models: list[str] | None = None          # None: load everything; else explicit model control
    http_port: int = 0                        # 0: pick a free port
    grpc_port: int = 0
    metrics_port: int = 0
    log_path: Path | None = None
    extra_args: list[str] = field(default_factory=list)
    proc: subprocess.Popen | None = None

    def command(self, install: ServerInstall) -> list[str]:
        cmd = [str(install.binary), f"--model-repository={Path(self.model_repository).resolve()}",
               f"--backend-directory={install.backend_dir}",
               f"--http-port={self.http_port}", f"--grpc-port={self.grpc_port}",
               f"--metrics-port={self.metrics_port}", "--exit-timeout-secs=15"]
        if self.models is not None:
            cmd.append("--model-control-mode=explicit")
            cmd += [f"--load-model={m}" for m in self.with_dependencies(self.models)]
        if not has_gpu():
            # No GPU: skip the CUDA pinned pool and GPU metrics (only noise in the log on a CPU machine).
            cmd += ["--allow-gpu-metrics=false", "--pinned-memory-pool-byte-size=0"]
        return cmd + self.extra_args

    def with_dependencies(self, models: list[str]) -> list[str]:
        """A streaming model's front calls its ensemble through BLS, which Triton cannot see:
        load `<name>_ensemble` alongside `<name>` when the repository has one."""
        repo = Path(self.model_repository)
        extra = [f"{m}_ensemble" for m in models if (repo / f"{m}_ensemble").is_dir()]
        return list(dict.fromkeys([*models, *extra]))

    def start(self, timeout: float = 300.0) -> "TritonServer":
        install = find_install()
        self.http_port = self.http_port or free_port()
        self.grpc_port = self.grpc_port or free_port()
        self.metrics_port = self.metrics_port or free_port()
        log = open(self.log_path, "wb") if self.log_path else subprocess.DEVNULL
        self.proc = subprocess.Popen(self.command(install), env=server_env(install), stdout=log,
                                     stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"tritonserver exited with code {self.proc.returncode}{self._log_tail()}")
            if self._ready():
                return self
            time.sleep(0.25)
        self.stop()
        raise TimeoutError(f"tritonserver not ready after {timeout:.0f} s{self._log_tail()}")

    def _ready(self) -> bool:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.http_port}/v2/health/ready", timeout=2) as r:
                return r.status == 200
        except OSError:
            return False

    def _log_tail(self, n: int = 40) -> str:
        if not self.log_path or not Path(self.log_path).exists():
            return ""
        lines = Path(self.log_path).read_text(errors="replace").splitlines()[-n:]
        return "\n--- server log (tail) ---\n" + "\n".join(lines)

    def stop(self, timeout: float = 30.0) -> None:
        """SIGTERM the server (it stops its stubs), then SIGKILL the whole process group if needed."""
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            pass
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)   # stubs left behind, if any
        except ProcessLookupError:
            pass
        self.proc.wait()

    @property
    def http_url(self) -> str:
        return f"127.0.0.1:{self.http_port}"

    @property
    def grpc_url(self) -> str:
        return f"127.0.0.1:{self.grpc_port}"

    def __enter__(self) -> "TritonServer":
        return self.start() if self.proc is None else self

    def __exit__(self, *exc) -> None:
        self.stop()
