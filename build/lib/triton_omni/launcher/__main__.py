"""`python -m triton_omni.launcher setup` prepares the backend folder; `python -m triton_omni.launcher serve ...` runs the server."""
from __future__ import annotations

import argparse
import sys

from triton_omni.launcher.triton import TritonServer, find_install


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m triton_omni.launcher")
    sub = ap.add_subparsers(dest="cmd", required=True)
    sub.add_parser("setup", help="prepare the python backend folder for this environment")
    serve = sub.add_parser("serve", help="run tritonserver in the foreground")
    serve.add_argument("--model-repository", default="model_repository")
    serve.add_argument("--models", nargs="*", default=None,
                       help="load only these models (explicit model control); default: all")
    serve.add_argument("--http-port", type=int, default=8000)
    serve.add_argument("--grpc-port", type=int, default=8001)
    serve.add_argument("--metrics-port", type=int, default=8002)
    serve.add_argument("extra", nargs=argparse.REMAINDER, help="more tritonserver flags after --")
    args = ap.parse_args(argv)

    install = find_install()
    if args.cmd == "setup":
        print(f"[setup] tritonserver: {install.binary}\n[setup] backends:    {install.backend_dir}")
        return 0
    server = TritonServer(args.model_repository, args.models, args.http_port, args.grpc_port,
                          args.metrics_port, extra_args=[a for a in args.extra if a != "--"])
    return server.run_foreground()


if __name__ == "__main__":
    sys.exit(main())
