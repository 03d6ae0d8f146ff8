"""Launch the real tritonserver (from the nvidia-pytriton wheel or the NGC image) for a model repository."""
from launcher.triton import TritonServer, find_install, prepare_backend_dir

__all__ = ["TritonServer", "find_install", "prepare_backend_dir"]
