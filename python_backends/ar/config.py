"""Typed engine configuration: the one definition of these settings (the AR step's parameters, ARParams,
extend it, so YAMLs and config.pbtxt set them by these names)."""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class EngineConfig:
    max_num_seqs: int = 16                  # sequences decoded together at most
    max_model_len: int = 2048               # prompt + output tokens per sequence
    max_num_batched_tokens: int = 8192      # prompt tokens packed into one prefill step
    block_size: int = 16                    # tokens per KV-cache block
    num_kv_blocks: int = 0                  # 0: on CPU, room for every sequence at full length;
                                            #    on GPU, what `gpu_memory_utilization` leaves free
    gpu_memory_utilization: float = 0.85
    cuda_graph_batch_sizes: list[int] = field(default_factory=lambda: [1, 2, 4, 8, 16, 32, 64])
    enforce_eager: bool = False             # True: never capture CUDA graphs
    use_triton_kernels: bool = True         # CUDA only: the kernels/ Triton kernels for hot ops
    # prefill steps of up to this many prompt tokens (all prompts of the step together) replayed as CUDA
    # graphs, padded to the next size; longer ones run eagerly. Only the sizes up to the first that
    # holds the largest possible step (max_num_batched_tokens, or one prompt of max_model_len) are captured.
    cuda_graph_prefill_tokens: list[int] = field(default_factory=lambda: [16, 32, 64, 128, 256, 512, 1024, 2048])
    # Waiting prompts are prefilled once no new prompt has arrived for `prefill_quiet_ms`, or the
    # oldest has waited `prefill_max_wait_ms`, or the step is full (running decodes go on meanwhile).
    # A burst that reaches the engine spread out (through a server) is then one prefill step instead
    # of several small ones that each stop every decode. 0: prefill whatever is waiting at once.
    prefill_quiet_ms: float = 0.0
    prefill_max_wait_ms: float = 0.0
    # prompts' full KV blocks kept and found again by their tokens (ar/prefix_cache.py): a prompt that
    # starts like an earlier one prefills only the rest. Attention-only models (see LLMEngine).
    enable_prefix_caching: bool = True
    # requests queued for their prefill at most (not yet running); past it a new request is refused at once
    # with UNAVAILABLE (the proxy: 429 with Retry-After) instead of waiting without bound. 0: no bound.
    max_waiting_seqs: int = 1024

    def prefill_graph_sizes(self) -> list[int]:
        """The prefill buckets a step can use: the configured sizes up to the first that holds the largest
        step (a bucket past it would only cost capture time and graph memory)."""
        sizes = sorted({t for t in self.cuda_graph_prefill_tokens if t > 0})
        largest = max(self.max_num_batched_tokens, self.max_model_len)
        return [t for t in sizes if t < largest] + [t for t in sizes if t >= largest][:1]

    def __post_init__(self) -> None:
        if self.max_num_seqs < 1 or self.max_model_len < 2 or self.block_size < 1 or self.max_waiting_seqs < 0:
            raise ValueError(f"invalid engine config {self}")
