"""Image generation and editing: text encoders, batched denoise loops, VAE decode/encode."""
