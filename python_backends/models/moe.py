"""The sparse mixture-of-experts MLP the MoE decoders share (Qwen3-MoE, Qwen3.5-MoE; Qwen3-Omni's
thinker and talker are the same block): a router picks `top_k` of `num_experts` gated-MLP experts per
token, softmax over all router logits, the top k kept (renormalised to sum 1 when the model says so),
and the token's output is their weighted sum; an optional shared expert every token goes through is
added, scaled by sigmoid of its own gate logit.

Parameter names are the checkpoints' (`mlp.gate`, `mlp.experts.*`, `mlp.shared_expert.*`,
`mlp.shared_expert_gate`), with two fusions (see MOE_PACKED and models/loader.py): the router, the
shared expert's gate and its gate/up projections read the same input, so they are one matmul
(`router`); the experts are stacked ([E, 2I, H] and [E, H, I]) for the grouped kernels.
"""
from __future__ import annotations

import torch
from torch import nn

from triton_omni.kernels import dispatch
from triton_omni.models.layers import Linear, MergedLinear, RMSNorm

# checkpoint name fragment -> (merged module, part); before the dense layers' gate_proj / up_proj in a
# model's `packed`, so that the shared expert's own projections go into the router matmul
MOE_PACKED = {"mlp.gate": ("mlp.router", 0), "mlp.shared_expert_gate": ("mlp.router", 1),
              "mlp.shared_expert.gate_proj": ("mlp.router", 2), "mlp.shared_expert.up_proj": ("mlp.router", 3)}


class StackedExperts(nn.Module):
    """Every expert's gate/up projection [E, 2I, H] (gate rows, then up rows) and down projection
    [E, H, I], filled whole from stacked checkpoints or an expert's projection at a time."""

    def __init__(self, num_experts: int, hidden: int, intermediate: int):
        super().__init__()
        self.num_experts, self.intermediate = num_experts, intermediate
        self.gate_up_proj = nn.Parameter(torch.empty(num_experts, 2 * intermediate, hidden))
        self.down_proj = nn.Parameter(torch.empty(num_experts, hidden, intermediate))

    def parts(self, which: str) -> list[tuple[int, str]]:
        """The per-expert tensors that fill `which` (models/loader.py)."""
        projections = ("gate_proj", "up_proj") if which == "gate_up_proj" else ("down_proj",)
        return [(e, p) for e in range(self.num_experts) for p in projections]

    def load_part(self, part: tuple[int, str], tensor: torch.Tensor, which: str) -> None:
        expert, projection = part
        if not 0 <= expert < self.num_experts:
            raise KeyError(f"expert {expert} of a layer with {self.num_experts} experts")
        target = getattr(self, which).data[expert]
        if projection != "down_proj":
            half = self.intermediate
            target = target[:half] if projection == "gate_proj" else target[half:]
        if target.shape != tensor.shape:
            raise ValueError(f"expert {expert} {projection}: checkpoint shape {tuple(tensor.shape)} != "
                             f"model {tuple(target.shape)}")
        target.copy_(tensor)


class SharedExpert(nn.Module):
    """The shared expert's down projection (its gate/up projections are part of the router matmul)."""

    def __init__(self, intermediate: int, hidden: int):
        super().__init__()
        self.down_proj = Linear(intermediate, hidden, bias=False)


class SparseMoeBlock(nn.Module):
    """The MLP of a MoE decoder layer. It takes the layer's residual stream and its post-attention
    norm (DecoderLayer: `norms_input`), because the experts need the normalised input itself: on a
    one-row decode step the norm is folded into the router matmul and again into the experts' kernel,
    otherwise it runs once before both."""

    norms_input = True

    def __init__(self, hidden: int, num_experts: int, top_k: int, intermediate: int, renormalize: bool,
                 shared_intermediate: int = 0):
        super().__init__()
        if not 1 <= top_k <= num_experts:
            raise ValueError(f"top_k {top_k} must be within 1..num_experts ({num_experts})")
        self.num_experts, self.top_k, self.renormalize = num_experts, top_k, renormalize
        self.shared_intermediate = shared_intermediate
        shared = [1, shared_intermediate, shared_intermediate] if shared_intermediate else []
        self.router = MergedLinear(hidden, [num_experts, *shared])
        self.experts = StackedExperts(num_experts, hidden, intermediate)
        if shared_intermediate:
            self.shared_expert = SharedExpert(shared_intermediate, hidden)

    @classmethod
    def from_config(cls, config, shared: bool) -> "SparseMoeBlock":
        if config.hidden_act != "silu":
            raise ValueError(f"MoE experts expect silu, got {config.hidden_act!r}")
        renormalize = getattr(config, "norm_topk_prob", True)   # Qwen3.5-MoE always renormalises
        return cls(config.hidden_size, config.num_experts, config.num_experts_per_tok, config.moe_intermediate_size,
                   renormalize, config.shared_expert_intermediate_size if shared else 0)

    def forward(self, x: torch.Tensor, residual: torch.Tensor, norm: RMSNorm) -> tuple[torch.Tensor, torch.Tensor]:
        """(MoE(norm(x + residual)), x + residual)."""
        if dispatch.folds_norm(x, norm.weight, self.router.weight):
            projected, residual = dispatch.norm_linear(x, residual, norm.weight, norm.eps, norm.zero_centered,
                                                       self.router.weight)
            h, fold = residual, (norm.weight, norm.eps, norm.zero_centered)
        else:
            h, residual = norm(x, residual)
            projected, fold = self.router(h), None
        E, shared = self.num_experts, None
        if self.shared_intermediate:
            shared = (projected[:, E:E + 1], projected[:, E + 1:], self.shared_expert.down_proj.weight)
        out = dispatch.sparse_moe(h, projected[:, :E], self.experts.gate_up_proj, self.experts.down_proj,
                                  self.top_k, self.renormalize, fold, shared)
        return out, residual
