"""Cosmos3 text to video (diffusers Cosmos3OmniPipeline): pre, text encoder, denoise, VAE decode steps."""
