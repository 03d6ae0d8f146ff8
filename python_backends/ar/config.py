"""Typed engine configuration (filled from the AR step's parameters)."""
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
    # While sequences decode, a new prompt may wait up to this many decode steps for others to share
    # its prefill step (a prefill stops every running sequence, and its cost is mostly per step, not
    # per prompt); it goes at once when the waiting prompts are at least `prefill_batch_fraction` of
    # the running sequences. 0: prefill every arrival at once. Nothing waits when nothing decodes.
    max_prefill_delay_steps: int = 8
    prefill_batch_fraction: float = 0.125

    def __post_init__(self) -> None:
        if self.max_num_seqs < 1 or self.max_model_len < 2 or self.block_size < 1:
            raise ValueError(f"invalid engine config {self}")
