"""FLUX.2-klein: its pre, text encoder, denoise and VAE decode steps."""
