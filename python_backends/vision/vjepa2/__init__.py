"""V-JEPA2 video embeddings: encoder and steps."""
