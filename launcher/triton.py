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

from triton_omni.client.progress import bar
from triton_omni.launcher.watchdog import StubWatchdog

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


class _Stop(Exception):
    """SIGTERM or SIGINT reached a foreground server's supervisor."""


EXIT_TIMEOUT_S = 15            # tritonserver's own grace for in-flight requests and model unloads
SHM_PREFIX = "triton_python_backend_shm_region_"


def group_processes(pgid: int) -> dict[int, list[str]]:
    """pid -> argv of every live process in a process group (the server and its stubs)."""
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if os.getpgid(int(entry.name)) != pgid:
                continue
            argv = (entry / "cmdline").read_bytes().split(b"\0")
            if (entry / "stat").read_text().rsplit(")", 1)[1].split()[0] != "Z":
                found[int(entry.name)] = [a.decode(errors="replace") for a in argv if a]
        except (OSError, IndexError, ProcessLookupError):
            continue
    return found


def stub_shm_files(processes: dict[int, list[str]]) -> set[Path]:
    """The /dev/shm segments named on the stubs' command lines (one per model instance)."""
    return {Path("/dev/shm") / a for argv in processes.values() for a in argv if a.startswith(SHM_PREFIX)}


@dataclass
class TritonServer:
    """A running tritonserver process. Use as a context manager; `stop()` leaves no stub behind."""

    model_repository: Path
    models: list[str] | None = None          # None: load everything
    http_port: int = 0                        # 0: pick a free port
    grpc_port: int = 0
    metrics_port: int = 0
    log_path: Path | None = None
    extra_args: list[str] = field(default_factory=list)
    proc: subprocess.Popen | None = None
    watch_stubs: bool = True                  # reload a model whose stub died (launcher/watchdog.py)
    watchdog: StubWatchdog | None = None

    def command(self, install: ServerInstall) -> list[str]:
        cmd = [str(install.binary), f"--model-repository={Path(self.model_repository).resolve()}",
               f"--backend-directory={install.backend_dir}",
               f"--http-port={self.http_port}", f"--grpc-port={self.grpc_port}",
               f"--metrics-port={self.metrics_port}", f"--exit-timeout-secs={EXIT_TIMEOUT_S}"]
        # explicit model control always (all models: `*`): the watchdog reloads a model through the API
        cmd.append("--model-control-mode=explicit")
        cmd += [f"--load-model={m}" for m in (self.with_dependencies(self.models) if self.models is not None else ["*"])]
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
        with bar(desc="tritonserver: loading and warming up", unit="poll") as waiting:
            while time.monotonic() < deadline:
                if self.proc.poll() is not None:
                    raise RuntimeError(f"tritonserver exited with code {self.proc.returncode}{self._log_tail()}")
                if self._ready():
                    self._start_watchdog()
                    return self
                time.sleep(0.25)
                waiting.update()
        self.stop()
        raise TimeoutError(f"tritonserver not ready after {timeout:.0f} s{self._log_tail()}")

    def run_foreground(self) -> int:
        """Serve until the server exits or this process gets SIGTERM/SIGINT (then `stop()`: the
        server's own shutdown, and no stub or shared-memory file left behind). The server's log goes
        to this terminal."""
        install = find_install()
        cmd = self.command(install)
        print("+", " ".join(cmd), flush=True)
        self.proc = subprocess.Popen(cmd, env=server_env(install), start_new_session=True)

        def on_signal(signum, frame):
            raise _Stop(signum)

        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, on_signal)
        try:
            while self.proc.poll() is None and not self._ready():
                time.sleep(0.25)
            self._start_watchdog()
            return self.proc.wait()
        except _Stop:
            return 0
        finally:
            for sig in (signal.SIGTERM, signal.SIGINT):
                signal.signal(sig, signal.SIG_IGN)     # a second Ctrl-C does not cut the cleanup short
            self.stop()

    def _start_watchdog(self) -> None:
        if self.watch_stubs and self.watchdog is None:
            self.watchdog = StubWatchdog(lambda: group_processes(self.proc.pid), self.http_url).start()

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

    def stop(self, timeout: float = EXIT_TIMEOUT_S + 10.0) -> None:
        """SIGTERM the server (it stops its stubs within its exit timeout); past `timeout`, or if stubs
        outlive it, SIGKILL the whole process group and remove the shared-memory files its stubs
        named. Seen without this: an idle gRPC stream a client keeps open holds tritonserver past
        its exit timeout, and a stub whose model never unloaded outlives the server (parent 1)."""
        if self.proc is None:
            return
        if self.watchdog is not None:
            self.watchdog.stop()                       # stubs now exit on purpose
        shm = stub_shm_files(group_processes(self.proc.pid))
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                pass
        shm |= stub_shm_files(group_processes(self.proc.pid))   # stubs started since
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)   # the server if it hung, stubs left behind
        except ProcessLookupError:
            pass
        self.proc.wait()
        deadline = time.monotonic() + 5
        while group_processes(self.proc.pid) and time.monotonic() < deadline:
            time.sleep(0.05)                           # the killed stubs' exits
        for f in shm:
            f.unlink(missing_ok=True)                  # a stub killed or orphaned leaves its segment

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
