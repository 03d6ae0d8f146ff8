"""Python client for triton-omni models (over tritonclient's gRPC and HTTP clients).

One class per task, each speaking the tensor contract of ensemble_configs/README.md; `python -m
client` is the command line on top, `client.openai_proxy` the OpenAI-compatible server.
"""
from client.chat import ChatChunk, ChatClient
from client.image import ImageClient
from client.speech import SpeechAudio, SpeechClient
from client.transcribe import TranscribeClient
from client.video import VideoClient

__all__ = ["ChatChunk", "ChatClient", "ImageClient", "SpeechAudio", "SpeechClient", "TranscribeClient",
           "VideoClient"]
