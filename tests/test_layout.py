"""The repository's shape: one import root (`triton_omni`), model families that never import each
other, and clients that stand apart from the serving code.

The top-level folders are mapped onto `triton_omni.*` (setup.py). These tests fail if one of them
becomes a global import name again, if the built wheel stops carrying them, if a model family
starts borrowing from another family instead of a shared module, or if client/ (CLI, OpenAI proxy)
starts needing the serving steps, torch or the converter (it must run in a slim image).
"""
from __future__ import annotations

import ast
import shutil
import subprocess
import sys
import venv
import zipfile
from pathlib import Path

import pytest

from tests.conftest import ROOT

MAPPED = {"python_backends": "triton_omni", "kernels": "triton_omni.kernels", "client": "triton_omni.client",
          "converters": "triton_omni.converters", "launcher": "triton_omni.launcher"}
# folders whose subpackages are model families: a family imports shared modules, never a sibling
FAMILY_PARENTS = ["python_backends/tts", "python_backends/image", "python_backends/asr", "python_backends/video",
                  "python_backends/vision"]
# categories of models: each imports the shared modules (diffusion/, media/, runtime/, ...), never another category
CATEGORIES = ["tts", "image", "asr", "video", "vision"]
# what client/ must never import: every python_backends package (the serving steps), the kernels,
# the converter, and the heavy libraries they pull in
SERVING = sorted({f"triton_omni.{p.stem}" for p in (ROOT / "python_backends").iterdir()
                  if (p / "__init__.py").exists() or p.suffix == ".py"}
                 | {"triton_omni.kernels", "triton_omni.converters", "torch", "transformers", "triton"})


def imported_modules(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
            names.update(f"{node.module}.{a.name}" for a in node.names)
    return names


@pytest.mark.parametrize("folder", sorted(MAPPED))
def test_mapped_folders_are_not_packages_at_the_root(folder):
    # a regular package here would be what `import <folder>` finds whenever the root is on sys.path
    assert not (ROOT / folder / "__init__.py").exists(), f"{folder}/__init__.py makes '{folder}' a global import name"


def test_import_kernels_from_the_root_is_not_ours():
    # transformers imports Hugging Face's `kernels` package; from the repository root it must find that one
    out = subprocess.run([sys.executable, "-c", "import kernels, json; print(json.dumps(list(kernels.__path__)))"],
                         cwd=ROOT, capture_output=True, text=True)
    if out.returncode != 0:
        assert "No module named 'kernels'" in out.stderr, out.stderr
        return
    assert str(ROOT / "kernels") not in out.stdout, f"'import kernels' from the root resolved to ours: {out.stdout}"


def test_families_import_no_other_family():
    borrowed = []
    for parent in FAMILY_PARENTS:
        base = ROOT / parent
        package = "triton_omni." + ".".join(Path(parent).relative_to("python_backends").parts)
        families = sorted(p.name for p in base.iterdir() if (p / "__init__.py").exists())
        for family in families:
            others = [f"{package}.{f}" for f in families if f != family]
            for path in sorted((base / family).rglob("*.py")):
                for name in imported_modules(path):
                    if any(name == o or name.startswith(o + ".") for o in others):
                        borrowed.append(f"{path.relative_to(ROOT)} imports {name}")
    assert not borrowed, "families import each other (move the piece to a shared module):\n" + "\n".join(borrowed)


def test_categories_import_no_other_category():
    borrowed = [f"{path.relative_to(ROOT)} imports {name}"
                for category in CATEGORIES for path in sorted((ROOT / "python_backends" / category).rglob("*.py"))
                for name in imported_modules(path)
                if any(_is_under(name, [f"triton_omni.{other}"]) for other in CATEGORIES if other != category)]
    assert not borrowed, "categories import each other (move the piece to a shared module):\n" + "\n".join(borrowed)


def test_wheel_carries_the_mapped_folders_and_imports_in_a_fresh_venv(tmp_path):
    # built from a copy: an in-tree build would leave build/ and an egg-info in the checkout
    src = tmp_path / "src"
    src.mkdir()
    for name in ["setup.py", "pyproject.toml", "README.md", *MAPPED]:
        copy = shutil.copytree if (ROOT / name).is_dir() else shutil.copy2
        copy(ROOT / name, src / name, **({"ignore": shutil.ignore_patterns("__pycache__")}
                                         if (ROOT / name).is_dir() else {}))
    wheels = tmp_path / "wheels"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(wheels), str(src)],
                   check=True, capture_output=True, cwd=tmp_path, timeout=300)
    wheel = next(wheels.glob("triton_omni-*.whl"))
    names = zipfile.ZipFile(wheel).namelist()
    assert "triton_omni/kernels/dispatch.py" in names and "triton_omni/runtime/step.py" in names
    assert "triton_omni/client/openai_proxy/app.py" in names and "triton_omni/launcher/cli.py" in names
    assert not any(n.split("/")[0] in MAPPED for n in names), "a top-level folder name reached the wheel's root"
    # a fresh venv with the wheel; its third-party dependencies are borrowed from this environment
    env = tmp_path / "venv"
    venv.EnvBuilder(with_pip=True).create(env)
    py = env / "bin" / "python"
    site = subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          check=True, capture_output=True, text=True).stdout.strip()
    deps = subprocess.run([sys.executable, "-c", "import torch, os; print(os.path.dirname(os.path.dirname(torch.__file__)))"],
                          check=True, capture_output=True, text=True).stdout.strip()
    Path(site, "deps.pth").write_text(deps + "\n")
    subprocess.run([str(py), "-m", "pip", "install", "-q", "--no-deps", "--no-index", str(wheel)], check=True,
                   capture_output=True, timeout=300)
    code = ("import triton_omni.kernels.dispatch as d, triton_omni.runtime.step, triton_omni.launcher.cli; "
            "print(d.__file__)")
    out = subprocess.run([str(py), "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().startswith(site), f"imported from {out.stdout.strip()}, not the installed wheel"


def test_nothing_imports_a_mapped_folder_by_its_folder_name():
    # `import converters` from the root still finds our folder as a namespace package (and a second
    # copy of every module it imports): the one name is triton_omni.*
    python_files = [p for p in ROOT.rglob("*.py")
                    if not any(part.startswith(".") or part in ("model_repository", "build") for part in p.relative_to(ROOT).parts)]
    wrong = [f"{path.relative_to(ROOT)} imports {name}" for path in sorted(python_files)
             for name in sorted(imported_modules(path)) if name.split(".")[0] in MAPPED]
    assert not wrong, "import these through triton_omni.*:\n" + "\n".join(wrong)


def _is_under(name: str, packages) -> bool:
    return any(name == p or name.startswith(p + ".") for p in packages)


def test_client_imports_no_serving_or_converter_module():
    reached = [f"{path.relative_to(ROOT)} imports {name}"
               for path in sorted((ROOT / "client").rglob("*.py"))
               for name in sorted(imported_modules(path)) if _is_under(name, SERVING)]
    assert not reached, "client/ must stand apart from the serving code:\n" + "\n".join(reached)


def test_tiny_builders_share_only_the_common_module():
    # converters/tiny.py is the entry point that imports every builder; a builder importing it (or
    # another builder) would be a cycle or a hidden dependency: what they share is tiny_common
    borrowed = [f"{path.relative_to(ROOT)} imports {name}"
                for path in sorted((ROOT / "converters").glob("tiny_*.py"))
                for name in sorted(imported_modules(path))
                if _is_under(name, ["triton_omni.converters.tiny"]) or (
                    name.startswith("triton_omni.converters.tiny_")
                    and not _is_under(name, ["triton_omni.converters.tiny_common"]))]
    assert not borrowed, "tiny builders import the entry point or each other:\n" + "\n".join(borrowed)


BLOCKER = """
import sys
class Blocked:
    def find_spec(self, name, path=None, target=None):
        if any(name == p or name.startswith(p + ".") for p in {blocked!r}):
            raise ImportError(f"blocked for this test: {{name}}")
sys.meta_path.insert(0, Blocked())
from triton_omni.client.openai_proxy.app import create_app
from triton_omni.client.openai_proxy.context import Settings
import triton_omni.client.cli
create_app(Settings())
print("ok")
"""


def test_proxy_app_runs_without_torch_or_the_serving_code():
    code = BLOCKER.format(blocked=SERVING)
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr


def test_no_product_file_over_600_lines():
    # one module, one job: a file past this is two jobs (split it along its seam)
    folders = [*MAPPED, "perf_analyzer_configs"]
    long = [f"{p.relative_to(ROOT)}: {n} lines" for folder in folders for p in sorted((ROOT / folder).rglob("*.py"))
            if (n := len(p.read_text().splitlines())) > 600]
    assert not long, "\n".join(long)
