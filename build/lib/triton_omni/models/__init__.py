"""Model implementations for the engines, loading Hugging Face-format checkpoints unchanged."""
