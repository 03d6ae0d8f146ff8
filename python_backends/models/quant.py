"""FP8 (E4M3) weights for linear layers: the module that holds them, the swap of a model's linears for
it, and reading checkpoints that are FP8 already.

`Fp8Linear` keeps float8_e4m3fn values and float32 dequantization scales (weight = q * s, the format of
kernels/fp8_matmul_reference.py) and multiplies through `dispatch.fp8_linear`: on CUDA the batch-1
skinny FP8 kernel, or torch._scaled_mm with the rows quantized too; the torch reference elsewhere.
The scales are per output channel when weights are quantized here (`fp8`), or per 128 x 128 block
(`fp8_block`, and what released FP8 checkpoints hold). The scale's name, `weight_scale_inv`, is those
checkpoints' (transformers' fine-grained FP8 layout: `quantization_config.quant_method` "fp8",
`weight_block_size` [bn, bk]), so such a checkpoint's tensors load into these modules as they are.

Where a module stays in 16 bits (a step without quantization, the lm_head) an FP8 checkpoint's
tensors are dequantized on the way in (`dequantized_stream`): every such checkpoint also loads as bf16.
"""
from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import Callable, Iterable, Iterator

import torch
from torch import nn

from triton_omni.kernels import dispatch, fp8_matmul_reference as fp8
from triton_omni.kernels.fp8_scaled_mm import blockwise_layout, fp8_gemm_device
from triton_omni.models.layers import Linear, MergedLinear

# a step's `quantization` -> the scale layout of the weights quantized at load (None: per channel)
SCHEMES: dict[str, tuple[int, int] | None] = {"fp8": None, "fp8_block": (128, 128)}
NONE = "none"
SCALE = "weight_scale_inv"


def check_scheme(name: str, device) -> tuple[int, int] | None:
    """The block of a `quantization` value (None: per channel); ValueError naming the parameter for an
    unknown one, or for a GPU without FP8 matmuls."""
    if name not in SCHEMES:
        raise ValueError(f"parameter 'quantization': expected one of {[NONE, *SCHEMES]}, got {name!r}")
    device = torch.device(device)
    if device.type == "cuda" and not fp8_gemm_device(device):
        raise ValueError(f"parameter 'quantization': {name} needs a GPU with FP8 matmuls (compute capability 8.9+); "
                         f"{torch.cuda.get_device_name(device)} has none")
    return SCHEMES[name]


class Fp8Linear(nn.Module):
    """y = x @ (weight * weight_scale_inv).T + bias, weight float8_e4m3fn [N, K], scales float32 [N] (per
    output channel) or [ceil(N / bn), ceil(K / bk)] (per block). forward(x [..., K]) as nn.Linear, and
    `gated` as layers.Linear (x [..., 2K] = [gate | up], silu(gate) * up first)."""

    def __init__(self, in_features: int, out_features: int, bias: bool = False, block: tuple[int, int] | None = None,
                 device=None, bias_dtype: torch.dtype | None = None):
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        self.weight = nn.Parameter(torch.empty(out_features, in_features, dtype=fp8.FP8, device=device),
                                   requires_grad=False)
        shape = (out_features,) if block is None else (-(-out_features // block[0]), -(-in_features // block[1]))
        self.weight_scale_inv = nn.Parameter(torch.ones(shape, dtype=torch.float32, device=device), requires_grad=False)
        self.bias = nn.Parameter(torch.zeros(out_features, dtype=bias_dtype, device=device), requires_grad=False) \
            if bias else None
        if block == (128, 128) and self.weight.is_cuda:
            blockwise_layout(self.weight.device)      # probed now: never inside a CUDA graph capture

    @property
    def block(self) -> tuple[int, int] | None:
        return fp8.scale_blocks(self.weight.shape, self.weight_scale_inv.shape)

    @classmethod
    def of(cls, linear: nn.Module, block: tuple[int, int] | None = None) -> "Fp8Linear":
        """An FP8 copy of a linear layer (nn.Linear, layers.Linear or MergedLinear) and its bias."""
        w = linear.weight.detach()
        bias = getattr(linear, "bias", None)
        merged = getattr(linear, "out_sizes", None)
        new = (Fp8MergedLinear(w.shape[1], merged, bias is not None, block, w.device, w.dtype) if merged
               else cls(w.shape[1], w.shape[0], bias is not None, block, w.device, w.dtype))
        new.set_weight(w, block)
        if bias is not None:
            new.bias.data.copy_(bias.detach())
        return new

    def set_weight(self, w: torch.Tensor, block: tuple[int, int] | None) -> None:
        q, s = fp8.quantize_weight(w, block)
        self.weight.data, self.weight_scale_inv.data = q.contiguous(), s.contiguous()

    def dequantized(self) -> torch.Tensor:
        return fp8.dequantize_weight(self.weight, self.weight_scale_inv)

    def forward(self, x: torch.Tensor, gated: bool = False) -> torch.Tensor:
        rows = x.reshape(-1, x.shape[-1])
        y = dispatch.fp8_linear(rows, self.weight, self.weight_scale_inv, self.bias, gated)
        return y.view(*x.shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        scales = "per channel" if self.block is None else f"per {self.block[0]}x{self.block[1]} block"
        return f"in_features={self.in_features}, out_features={self.out_features}, fp8 e4m3, scales {scales}"


class Fp8MergedLinear(Fp8Linear):
    """MergedLinear's fused projections in FP8: `load_part` fills a part's rows of the weight and of its
    scales (per block: each part a whole number of block rows)."""

    def __init__(self, in_features: int, out_sizes: list[int], bias: bool = False, block=None, device=None,
                 bias_dtype=None):
        super().__init__(in_features, sum(out_sizes), bias, block, device, bias_dtype)
        self.out_sizes = list(out_sizes)

    def load_part(self, index: int, tensor: torch.Tensor, which: str = "weight") -> None:
        start, size = sum(self.out_sizes[:index]), self.out_sizes[index]
        if which == SCALE and self.block is not None:
            if any(n % self.block[0] for n in self.out_sizes):
                raise ValueError(f"parts {self.out_sizes} are not whole {self.block[0]}-row blocks")
            start, size = start // self.block[0], size // self.block[0]
        getattr(self, which).data[start:start + size].copy_(tensor)


def _linears(model: nn.Module, want: Callable[[str, nn.Module], bool]) -> list[tuple[str, nn.Module, str, nn.Module]]:
    """(name, parent, attribute, module) of each module `want(name, module)` picks."""
    return [(name, model.get_submodule(name.rpartition(".")[0]), name.rpartition(".")[2], module)
            for name, module in model.named_modules() if want(name, module)]


def quantize_linears(model: nn.Module, block: tuple[int, int] | None,
                     want: Callable[[str, nn.Module], bool]) -> list[str]:
    """Replace each linear layer `want(name, module)` picks by its Fp8Linear copy (the 16-bit weights
    freed); returns their names."""
    picked = _linears(model, lambda n, m: not isinstance(m, Fp8Linear) and want(n, m))
    for _, parent, attr, module in picked:
        setattr(parent, attr, Fp8Linear.of(module, block))
    return [name for name, *_ in picked]


def quantize_decoder(model: nn.Module, scheme: str, lm_head: bool = False) -> None:
    """A decoder LM's linear layers (layers.Linear / MergedLinear: every projection of every layer) in
    FP8, and its lm_head with `lm_head` (an FP8 copy: a tied embedding keeps its table). Those already
    FP8 (from an FP8 checkpoint) stay as they are."""
    device = next(model.parameters()).device
    block = check_scheme(scheme, device)
    if block is not None and device.type == "cuda" and blockwise_layout(device) is None:
        warnings.warn(f"torch._scaled_mm takes no block scales on {torch.cuda.get_device_name(device)}: "
                      "FP8 weights per output channel instead", stacklevel=2)
        block = None
    quantize_linears(model, block, lambda name, m: isinstance(m, (Linear, MergedLinear)))
    if lm_head and not isinstance(model.lm_head, Fp8Linear):
        model.lm_head = Fp8Linear.of(model.lm_head, block)
    if device.type == "cuda":
        # a checkpoint's blocks that torch._scaled_mm cannot take here (another block size, or none at
        # all on this GPU): per channel, else every prefill would dequantize them
        for m in model.modules():
            if isinstance(m, Fp8Linear) and m.block is not None and (
                    m.block != (128, 128) or blockwise_layout(device) is None):
                m.set_weight(m.dequantized(), None)


def fp8_parameters(model: nn.Module) -> set[int]:
    """ids of the FP8 modules' weights and scales (a dtype cast of the model must leave them be)."""
    return {id(p) for m in model.modules() if isinstance(m, Fp8Linear) for p in (m.weight, m.weight_scale_inv)}


# --- checkpoints in FP8 ----------------------------------------------------------------------------

def checkpoint_block(folder: str | Path) -> tuple[int, int] | None | str:
    """The FP8 layout of a checkpoint folder's config.json: its `weight_block_size` (bn, bk), "tensor"
    (one scale a weight), or None for a checkpoint without FP8 weights. Other quantization methods
    are refused by name."""
    path = Path(folder) / "config.json"
    config = json.loads(path.read_text()) if path.exists() else {}
    q = config.get("quantization_config") or (config.get("text_config") or {}).get("quantization_config")
    if not q:
        return None
    if q.get("quant_method") != "fp8" or q.get("fmt", "e4m3") != "e4m3":
        raise ValueError(f"{path}: quantization_config {q.get('quant_method')!r} ({q.get('fmt')}) is not supported; "
                         "checkpoints in transformers' fine-grained FP8 layout (quant_method 'fp8', e4m3) are")
    block = q.get("weight_block_size")
    return tuple(block) if block else "tensor"


def scaled_prefixes(names: Iterable[str]) -> set[str]:
    """The checkpoint's FP8 weights: the X of every X.weight_scale_inv among `names`."""
    return {n[:-len(SCALE) - 1] for n in names if n.endswith(f".{SCALE}")}


def dequantized_stream(tensors: Iterable[tuple[str, torch.Tensor]], scaled: set[str], keep: Callable[[str], bool],
                       where: str = "") -> Iterator[tuple[str, torch.Tensor]]:
    """An FP8 checkpoint's tensors, each FP8 weight `X.weight` (X in `scaled`) with its `X.weight_scale_inv`
    either passed on as they are (`keep("X.weight_scale_inv")`: the model has an FP8 place for it) or
    merged into one float32 `X.weight` = q * s. Either may come first; anything else passes through."""
    pending: dict[str, dict[str, torch.Tensor]] = {}
    for name, tensor in tensors:
        prefix, _, leaf = name.rpartition(".")
        if prefix not in scaled or leaf not in ("weight", SCALE) or keep(f"{prefix}.{SCALE}"):
            yield name, tensor
            continue
        pair = pending.setdefault(prefix, {})
        pair[leaf] = tensor
        if len(pair) == 2:
            q, s = pending.pop(prefix)["weight"], pair[SCALE].float()
            s = s.reshape(1).expand(q.shape[0]) if s.numel() == 1 else s      # one scale for the whole tensor
            yield f"{prefix}.weight", fp8.dequantize_weight(q, s)
    if pending:
        prefix, pair = next(iter(pending.items()))
        raise KeyError(f"{where}: checkpoint tensor {prefix}.{next(iter(pair))} comes without "
                       f"{prefix}.{'weight' if SCALE in pair else SCALE}")


def prepare_checkpoint_fp8(model: nn.Module, block, scheme: str, fp8_parts: dict[str, set]) -> None:
    """Before loading an FP8 checkpoint into a model whose step asks for FP8: give each linear layer the
    checkpoint holds in FP8 blocks (`fp8_parts`: module name -> the parts of it that come with scales,
    {None} for an unmerged one) an empty Fp8Linear of that block, so its values and scales load as they
    are. Per-tensor checkpoints, parts that are not whole blocks and partly FP8 merged layers are left
    to load dequantized (then quantized as the scheme says)."""
    check_scheme(scheme, next(model.parameters()).device)
    if not isinstance(block, tuple):
        return
    for name, parent, attr, module in _linears(model, lambda n, m: isinstance(m, (Linear, MergedLinear))):
        sizes = getattr(module, "out_sizes", None)
        whole = fp8_parts.get(name) == (set(range(len(sizes))) if sizes else {None})
        if not whole or (sizes and any(n % block[0] for n in sizes)):
            continue
        w, bias = module.weight, getattr(module, "bias", None)
        setattr(parent, attr, Fp8MergedLinear(w.shape[1], sizes, bias is not None, block, w.device, w.dtype) if sizes
                else Fp8Linear(w.shape[1], w.shape[0], bias is not None, block, w.device, w.dtype))


def fp8_parts(model: nn.Module, names: Iterable[str]) -> dict[str, set]:
    """Which parts of which of the model's modules an FP8 checkpoint (its tensor `names`) holds in FP8:
    module name -> part indices (None: an unmerged module)."""
    from triton_omni.models.loader import placement

    place, parts = placement(model), {}
    for prefix in scaled_prefixes(names):
        target, part = place(f"{prefix}.weight")
        if target is not None:
            parts.setdefault(target.removesuffix(".weight"), set()).add(part)
    return parts


# --- diffusion transformers ---------------------------------------------------------------------------

# names of the per-image modulation projections inside diffusers' blocks: Z-Image's adaLN_modulation,
# Qwen-Image's img_mod / txt_mod, the AdaLayerNorm* linears (norm1.linear) of the FLUX.1-style blocks
MODULATION = ("modulation", "_mod.", "norm")


def quantize_blocks(model: nn.Module, scheme: str) -> list[str]:
    """A diffusers transformer's repeated blocks (`_repeated_blocks`: what compile_repeated_blocks
    compiles) with their linear layers in FP8, per output channel, the activations quantized a row at a
    time (torch._scaled_mm on the GPU). The per-image modulation projections stay in 16 bits: a row an
    image, and every norm's scale and shift hangs on them. Returns the names replaced."""
    if scheme != "fp8":
        raise ValueError(f"parameter 'quantization': a denoise step takes 'none' or 'fp8', got {scheme!r}")
    block = check_scheme(scheme, next(model.parameters()).device)
    classes = set(getattr(model, "_repeated_blocks", None) or ())
    if not classes:
        raise ValueError(f"parameter 'quantization': {type(model).__name__} declares no repeated blocks")
    return quantize_linears(model, block, lambda name, m: (
        type(m) is nn.Linear and not any(f in name for f in MODULATION)
        and any(type(p).__name__ in classes for p in _parents(model, name))))


def _parents(model: nn.Module, name: str) -> list[nn.Module]:
    parts = name.split(".")
    return [model.get_submodule(".".join(parts[:i])) for i in range(1, len(parts))]
