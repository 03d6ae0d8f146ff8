"""What the diffusion categories (image/, video/) share: pipeline folders and their components, moving
tensors between steps, token-id checks, the text encoder step's batching, the attention backend."""
