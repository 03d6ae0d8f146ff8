"""Python client for triton-omni ensembles (over tritonclient's gRPC and HTTP clients)."""
from client.chat import ChatChunk, ChatClient

__all__ = ["ChatChunk", "ChatClient"]
