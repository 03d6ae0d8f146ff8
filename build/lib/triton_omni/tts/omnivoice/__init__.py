"""OmniVoice: masked iterative decoding over a bidirectional Qwen3, its codec and the steps."""
