"""Video generation: shared request parsing and pre step, the decoupled denoise step and its loop,
whole-clip VAE encode / decode, MP4 encoding; one subpackage per model family."""
