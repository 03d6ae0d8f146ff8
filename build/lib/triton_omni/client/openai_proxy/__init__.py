"""An OpenAI-compatible HTTP server in front of Triton, its routes read from Triton's model configs.

    python -m triton_omni.client.openai_proxy --triton-url localhost:8001 --port 9000 [--api-key KEY]

Routes: /v1/models, /v1/chat/completions, /v1/audio/speech, /v1/audio/voices,
/v1/audio/transcriptions, /v1/images/generations, /v1/images/edits, /v1/videos. See README.md.
"""
