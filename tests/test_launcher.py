"""The launcher's environment for tritonserver and its python stubs."""
from __future__ import annotations

import os
import sysconfig
from pathlib import Path

import pytest

from triton_omni.launcher.triton import ServerInstall, libpython_dir, server_env


def test_only_libpython_goes_on_the_library_path(monkeypatch):
    """The stubs must find this interpreter's libpython, and nothing else from its LIBDIR: for a system
    Python that is /usr/lib/<arch>, whose libraries (an older cuDNN) would shadow torch's own."""
    monkeypatch.delenv("LD_LIBRARY_PATH", raising=False)
    name = sysconfig.get_config_var("INSTSONAME")
    if not (Path(sysconfig.get_config_var("LIBDIR") or "/") / (name or "-")).exists():
        pytest.skip("this interpreter has no shared libpython (the python stub could not run with it either)")
    folder = libpython_dir()
    assert folder is not None and os.listdir(folder) == [name]
    assert (folder / name).resolve() == (Path(sysconfig.get_config_var("LIBDIR")) / name).resolve()
    env = server_env(ServerInstall(Path("/bin/true"), Path("/tmp"), (Path("/opt/server-libs"),)))
    dirs = env["LD_LIBRARY_PATH"].split(os.pathsep)
    assert dirs == ["/opt/server-libs", str(folder)]
    assert sysconfig.get_config_var("LIBDIR") not in dirs


def test_a_users_library_path_is_kept_last(monkeypatch):
    monkeypatch.setenv("LD_LIBRARY_PATH", "/my/libs")
    env = server_env(ServerInstall(Path("/bin/true"), Path("/tmp")))
    assert env["LD_LIBRARY_PATH"].split(os.pathsep)[-1] == "/my/libs"
