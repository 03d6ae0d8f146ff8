"""`triton-omni VERB ...`: one command for the project's verbs, each handed to the module that owns it.

    triton-omni build | check | tiny ...     the converter (ensemble YAMLs -> model repository, tiny checkpoints)
    triton-omni setup | serve ...            the launcher (the real tritonserver)
    triton-omni proxy ...                    the OpenAI-compatible proxy
    triton-omni chat | embed | speech | transcribe | image | edit | video ...   the client, over Triton's gRPC

`python -m triton_omni.converters build ...` and the like work the same.
"""
from __future__ import annotations

import importlib
import sys

# verb -> module whose main(argv) handles it; converter and launcher verbs keep the verb in argv
VERBS = {
    "build": "triton_omni.converters.__main__", "check": "triton_omni.converters.__main__",
    "tiny": "triton_omni.converters.__main__",
    "setup": "triton_omni.launcher.__main__", "serve": "triton_omni.launcher.__main__",
    "proxy": "triton_omni.client.openai_proxy.__main__",
    **{v: "triton_omni.client.cli" for v in ("chat", "embed", "speech", "transcribe", "image", "edit", "video")},
}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help") or argv[0] not in VERBS:
        print(__doc__.strip(), file=sys.stderr if argv and argv[0] not in ("-h", "--help") else sys.stdout)
        return 0 if argv and argv[0] in ("-h", "--help") else 2
    verb, rest = argv[0], argv[1:]
    module = importlib.import_module(VERBS[verb])
    return module.main(rest if verb == "proxy" else [verb, *rest]) or 0


if __name__ == "__main__":
    sys.exit(main())
