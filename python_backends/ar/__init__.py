"""The autoregressive decode engine: continuous batching over a paged KV cache.

    sampling.py      request sampling parameters + the batched, seeded sampler
    sequence.py      one request's state
    block_manager.py paged KV blocks and recurrent-state slots
    scheduler.py     who runs in the next step (prefill of new prompts, else decode of all)
    model_runner.py  tensors for a step, the forward pass, sampling (and CUDA graphs on GPU)
    engine.py        the step loop; add / abort requests from any thread
    prompt_embeds.py prompts with spliced embeddings (encoder outputs) and their own rotary positions
    step.py          the decoupled AR step (token ids in, token ids streamed out); embeds_step.py with
                     spliced prompt embeddings
"""
