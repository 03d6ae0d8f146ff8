"""`python -m triton_omni.client.openai_proxy --triton-url localhost:8001 --port 9000 [--api-key-file keys.txt]`"""
from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from triton_omni.client.openai_proxy.context import Settings


def parser() -> argparse.ArgumentParser:
    d = Settings()
    ap = argparse.ArgumentParser(prog="python -m triton_omni.client.openai_proxy", description=__doc__)
    ap.add_argument("--triton-url", default=d.triton_url, help="Triton's gRPC endpoint (host:port)")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=9000)
    keys = ap.add_argument_group("API keys", "a request must send 'Authorization: Bearer KEY' with one of the keys "
                                 "of --api-key, --api-key-file and $OPENAI_PROXY_API_KEYS (comma-separated); "
                                 "with none the proxy is open")
    keys.add_argument("--api-key", action="append", default=[], metavar="KEY", help="a key (repeatable)")
    keys.add_argument("--api-key-file", action="append", default=[], type=Path, metavar="FILE",
                      help="a file of keys, one a line, '#' comments (repeatable)")
    limits = ap.add_argument_group("limits")
    limits.add_argument("--max-body-bytes", type=int, default=d.max_body_bytes, help="larger bodies get 413")
    limits.add_argument("--max-upload-bytes", type=int, default=d.max_upload_bytes,
                        help="a larger uploaded file gets 413")
    limits.add_argument("--max-text-chars", type=int, default=d.max_text_chars,
                        help="a longer text field (and chat messages in all) gets 400, before any work on it")
    limits.add_argument("--rate-limit", type=float, default=d.rate_limit_per_minute, metavar="PER_MINUTE",
                        help="requests a minute per API key (per client address without keys); past it 429 "
                             "with Retry-After (default 0: no limit)")
    limits.add_argument("--rate-limit-burst", type=int, default=None, metavar="N",
                        help="requests at once before the rate applies (default: a minute's worth)")
    limits.add_argument("--request-timeout", type=float, default=d.request_timeout_s,
                        help="seconds a Triton request may run; 504 past it")
    ap.add_argument("--cors-origin", action="append", default=[], metavar="ORIGIN",
                    help="send CORS headers for browser calls from this origin ('*': any; repeatable; default: "
                         "no CORS headers)")
    ap.add_argument("--voices-dir", type=Path, default=None, help="keep uploaded voices here (default: memory)")
    ap.add_argument("--allow-media-urls", action="store_true",
                    help="fetch http(s) image and video URLs of chat messages and embedding inputs (default: only "
                         "base64 data: URLs; at most --max-upload-bytes each)")
    rt = ap.add_argument_group("realtime", "WebSocket /v1/realtime: speech to text -> chat -> text to speech; "
                               "a session's own model names win over these")
    rt.add_argument("--realtime-chat-model", default=None, metavar="NAME",
                    help="the chat model (default: the one chat model served)")
    rt.add_argument("--realtime-transcription-model", default=None, metavar="NAME",
                    help="the speech-to-text model (default: the one transcription model served)")
    rt.add_argument("--realtime-speech-model", default=None, metavar="NAME",
                    help="the text-to-speech model (default: the one speech model served)")
    rt.add_argument("--realtime-voice", default=None, metavar="VOICE", help="its voice (default: the model's own)")
    rt.add_argument("--realtime-max-buffer-bytes", type=int, default=d.realtime_max_buffer_bytes, metavar="N",
                    help="a session's input audio buffer; an append past it gets an error event")
    rt.add_argument("--realtime-max-sessions", type=int, default=d.realtime_max_sessions, metavar="N",
                    help="sessions open at once; past it the WebSocket handshake gets 429")
    ap.add_argument("--log-level", default="info")
    return ap


def settings_of(args: argparse.Namespace) -> Settings:
    from triton_omni.client.openai_proxy.guards import read_api_keys

    return Settings(triton_url=args.triton_url, api_keys=read_api_keys(args.api_key, args.api_key_file),
                    max_body_bytes=args.max_body_bytes, max_upload_bytes=args.max_upload_bytes,
                    max_text_chars=args.max_text_chars, rate_limit_per_minute=args.rate_limit,
                    rate_limit_burst=args.rate_limit_burst, cors_origins=tuple(args.cors_origin),
                    voices_dir=args.voices_dir, request_timeout_s=args.request_timeout,
                    allow_media_urls=args.allow_media_urls, realtime_chat_model=args.realtime_chat_model,
                    realtime_transcription_model=args.realtime_transcription_model,
                    realtime_speech_model=args.realtime_speech_model, realtime_voice=args.realtime_voice,
                    realtime_max_buffer_bytes=args.realtime_max_buffer_bytes,
                    realtime_max_sessions=args.realtime_max_sessions)


def main(argv: list[str] | None = None) -> int:
    ap = parser()
    args = ap.parse_args(argv)
    try:
        settings = settings_of(args)
    except (OSError, ValueError) as e:
        ap.error(str(e))

    import uvicorn

    from triton_omni.client.openai_proxy.app import create_app

    logging.basicConfig(level=args.log_level.upper(), format="%(levelname)s %(name)s: %(message)s")
    app = create_app(settings)
    logging.getLogger("openai_proxy").info("offering the models Triton at %s has ready with an openai_route "
                                           "(%s)", args.triton_url,
                                           f"{len(settings.api_keys)} API keys" if settings.api_keys else "open")
    uvicorn.run(app, host=args.host, port=args.port, log_level=args.log_level)
    return 0


if __name__ == "__main__":
    sys.exit(main())
