"""`python -m triton_omni.client.openai_proxy --triton-url localhost:8001 --port 9000 [--api-key KEY]`"""
from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path

from triton_omni.client.openai_proxy.context import Settings


def main(argv: list[str] | None = None) -> int:
    defaults = Settings()
    ap = argparse.ArgumentParser(prog="python -m triton_omni.client.openai_proxy", description=__doc__)
    ap.add_argument("--triton-url", default=defaults.triton_url, help="Triton's gRPC endpoint (host:port)")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=9000)
    ap.add_argument("--api-key", default=os.environ.get("OPENAI_PROXY_API_KEY"),
                    help="require 'Authorization: Bearer KEY' (default: $OPENAI_PROXY_API_KEY; none: open)")
    ap.add_argument("--max-body-bytes", type=int, default=defaults.max_body_bytes, help="larger bodies get 413")
    ap.add_argument("--voices-dir", type=Path, default=None, help="keep uploaded voices here (default: memory)")
    ap.add_argument("--request-timeout", type=float, default=defaults.request_timeout_s)
    ap.add_argument("--log-level", default="info")
    args = ap.parse_args(argv)

    import uvicorn

    from triton_omni.client.openai_proxy.app import create_app

    logging.basicConfig(level=args.log_level.upper(), format="%(levelname)s %(name)s: %(message)s")
    app = create_app(Settings(triton_url=args.triton_url, api_key=args.api_key, max_body_bytes=args.max_body_bytes,
                              voices_dir=args.voices_dir,
                              request_timeout_s=args.request_timeout))
    logging.getLogger("openai_proxy").info("offering the models Triton at %s has ready with an openai_route",
                                           args.triton_url)
    uvicorn.run(app, host=args.host, port=args.port, log_level=args.log_level)
    return 0


if __name__ == "__main__":
    sys.exit(main())
