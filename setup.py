"""Maps the repository's top-level folders onto one distribution, `triton_omni`.

The folders keep the layout the product is read by (python_backends/, kernels/, client/, ...), while
their import names live under `triton_omni.` alone, so no PyPI package can shadow ours or be shadowed
by it. A mapped folder carries no `__init__.py` of its own: a regular package at the repository root
would be imported instead of PyPI's whenever the root is on sys.path (as `python -c` from it puts it).
"""
from pathlib import Path

from setuptools import setup

ROOT = Path(__file__).resolve().parent
# import name <- folder (the first is the distribution's root package)
PACKAGE_DIRS = {
    "triton_omni": "python_backends",
    "triton_omni.kernels": "kernels",
    "triton_omni.client": "client",
    "triton_omni.converters": "converters",
    "triton_omni.launcher": "launcher",
}


def packages() -> list[str]:
    """Every mapped folder and every folder under it that holds Python files."""
    found = []
    for name, folder in PACKAGE_DIRS.items():
        for sub in [ROOT / folder, *sorted(p for p in (ROOT / folder).rglob("*") if p.is_dir())]:
            rel = sub.relative_to(ROOT / folder).parts
            if "__pycache__" in rel or not any(sub.glob("*.py")):
                continue
            if rel and ".".join((name, *rel)) in PACKAGE_DIRS:
                continue
            found.append(".".join((name, *rel)))
    return found


# files that are not Python but ship with a package (the proxy's playground page)
PACKAGE_DATA = {"triton_omni.client.openai_proxy": ["playground/*.html", "playground/*.js", "playground/*.css"]}

setup(packages=packages(), package_dir=PACKAGE_DIRS, package_data=PACKAGE_DATA)
