"""FP8 weights against bf16 on the same weights, for the benchmarks that time them (bench_ar_decode,
bench_image): how far each layer's output and the final logits / latents move, as relative L2 errors
(||fp8 - bf16|| / ||bf16||), and the table the results pages print.

Two kinds of rows:
- `linear`: one linear layer alone, on random Gaussian rows: M = 1 (a batch-1 decode step: the
  weight-only skinny kernel on the GPU) and M = 256 (prefill and batches: the rows quantized too,
  torch._scaled_mm). What quantizing its weights (and activations) costs that layer by itself.
- `stream`: the output of each repeated layer (a decoder layer's residual stream, a transformer
  block's hidden states) in one forward of the whole model, bf16 and FP8 side by side: the error as
  it builds up through the network; then the final logits (with top-1 agreement) or latents.
"""
from __future__ import annotations

import contextlib
import copy
import random
import re
import statistics

import torch

# --weights of the benchmarks -> (the steps' `quantization`, the AR step's `quantize_lm_head`)
WEIGHTS = {"bf16": ("none", False), "fp8": ("fp8", False), "fp8_block": ("fp8_block", False),
           "fp8_lm_head": ("fp8", True)}
_SUFFIX = re.compile(r" \((fp8\w*) weights\)$")


def label(mode: str, weights: str) -> str:
    """A mode's label with its weights: "ours in-process (fp8 weights)"; bf16 rows keep the plain one."""
    return mode if weights == "bf16" else f"{mode} ({weights} weights)"


def base_mode(mode: str) -> str:
    return _SUFFIX.sub("", mode)


def weights_of(mode: str) -> str:
    found = _SUFFIX.search(mode)
    return found.group(1) if found else "bf16"


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.float(), b.float()
    return ((a - b).norm() / b.norm().clamp(min=1e-30)).item()


@torch.no_grad()
def linear_errors(pairs, rows=(1, 256), seed: int = 0) -> list[dict]:
    """pairs: (name, the bf16 module, its Fp8Linear, gated). Per pair and row count: the relative error
    of the FP8 layer's output on random rows."""
    out = []
    for name, ref, q, gated in pairs:
        g = torch.Generator(device=q.weight.device).manual_seed(seed)
        for m in rows:
            width = q.in_features * (2 if gated else 1)
            x = torch.randn(m, width, generator=g, device=q.weight.device).to(ref.weight.dtype)
            want = ref(x, gated=True) if gated else ref(x)
            got = q(x, gated=gated)
            out.append({"kind": "linear", "layer": name, "rows": m, "rel_err": rel(got, want)})
    return out


@contextlib.contextmanager
def layer_outputs(layers, combine=lambda out: out):
    """Collects combine(output) of each module in `layers`, call after call: a list per layer."""
    seen: list[list[torch.Tensor]] = [[] for _ in layers]
    hooks = [m.register_forward_hook(lambda mod, args, out, i=i: seen[i].append(combine(out).detach().float().cpu()))
             for i, m in enumerate(layers)]
    try:
        yield seen
    finally:
        for h in hooks:
            h.remove()


def stream_rows(names: list[str], ref: list[list[torch.Tensor]], got: list[list[torch.Tensor]]) -> list[dict]:
    """One row per layer: its outputs' relative error, over every call the forward(s) made."""
    return [{"kind": "stream", "layer": n, "calls": len(r),
             "rel_err": rel(torch.cat([t.flatten() for t in g]), torch.cat([t.flatten() for t in r]))}
            for n, r, g in zip(names, ref, got) if r and len(r) == len(g)]


def final_row(what: str, got: torch.Tensor, want: torch.Tensor, top1: bool = False) -> dict:
    row = {"kind": "final", "layer": what, "rel_err": rel(got, want),
           "max_abs_err": (got.float() - want.float()).abs().max().item()}
    if top1:
        row["top1_agreement"] = (got.argmax(-1) == want.argmax(-1)).float().mean().item()
    return row


def summary(model: str, weights: str, rows: list[dict], baseline: str = "bf16") -> str:
    """One line for the results' notes."""
    parts = [f"{what} {err}" + (f", top-1 agreement {top1}" if top1 else "") for what, err, _, top1 in condensed(rows)]
    return f"FP8 accuracy, {model}, {weights} weights against {baseline} (same random weights, relative L2 errors): " \
        + "; ".join(parts) + "."


def condensed(rows: list[dict]) -> list[tuple[str, str, str, str]]:
    """(what, relative error, max abs, top-1) lines: the linear rows by row count (median, max over the
    layers), the layer outputs (first, last, max), the finals."""
    out = []
    lin = [r for r in rows if r["kind"] == "linear"]
    for m in sorted({r["rows"] for r in lin}):
        errs = [r["rel_err"] for r in lin if r["rows"] == m]
        out.append((f"{len(errs)} linear layers alone, {m} row{'s' if m > 1 else ''} (median, max)",
                    f"{statistics.median(errs):.4f}, {max(errs):.4f}", "", ""))
    stream = [r["rel_err"] for r in rows if r["kind"] == "stream"]
    if stream:
        out.append((f"output of each of {len(stream)} layers (first, last, max)",
                    f"{stream[0]:.4f}, {stream[-1]:.4f}, {max(stream):.4f}", "", ""))
    for r in rows:
        if r["kind"] == "final":
            out.append((r["layer"], f"{r['rel_err']:.4f}", f"{r['max_abs_err']:.3g}",
                        f"{100 * r['top1_agreement']:.1f}%" if "top1_agreement" in r else ""))
    return out


def table_lines(entries: list[dict]) -> list[str]:
    """The accuracy table of a results page (entries: {model, weights, rows}; every row in the JSON)."""
    if not entries:
        return []
    lines = ["", "FP8 accuracy against 16-bit weights (fp32 in a CPU check), the same random ones (relative L2 "
             "error; a linear layer alone on random rows; each repeated layer's output through the whole model; "
             "the final logits / latents):", "",
             "| model | weights | what | rel. error | max abs error | top-1 agreement |", "|---|---|---|---:|---:|---:|"]
    for e in entries:
        lines += [f"| {e['model']} | {e['weights']} | {what} | {err} | {mx} | {top1} |"
                  for what, err, mx, top1 in condensed(e["rows"])]
    return lines


def speedups(rows: list[dict], key: str, goal: float, what: str, match=("model", "concurrency")) -> list[str]:
    """Target lines: each FP8 row's `key` against the bf16 row of the same base mode and `match` fields."""
    out = []
    for r in rows:
        w = weights_of(r["mode"])
        if w == "bf16" or key not in r:
            continue
        base = next((b for b in rows if b["mode"] == base_mode(r["mode"]) and all(b.get(f) == r.get(f) for f in match)
                     and key in b), None)
        if base:
            x = r[key] / base[key] if key.endswith("_per_s") else base[key] / r[key]
            where = ", ".join(f"{f}={r[f]}" for f in match)
            out.append(f"{where}: {base_mode(r['mode'])} {w} weights {what} {x:.2f}x bf16 "
                       f"(target >= {goal}x): {'PASS' if x >= goal else 'FAIL'}")
    return out


# --- the AR engine -------------------------------------------------------------------------------------
@torch.no_grad()
def ar_accuracy(folder, device, dtype: torch.dtype, weights: str, prompt_len: int, seed: int = 0) -> list[dict]:
    """A decoder LM with random weights (the engine's dummy load, `seed`) in bf16 and the same weights in
    FP8 (`weights`): linear rows for the first and last layer's projections (and the lm_head when it is
    FP8), the residual stream after every layer and the logits of a `prompt_len`-token prompt (prefill:
    W8A8), and the logits of its first token alone (one row: the weight-only decode path)."""
    from triton_omni.ar.config import EngineConfig
    from triton_omni.ar.engine import LLMEngine
    from triton_omni.ar.sampling import SamplingParams
    from triton_omni.ar.step import enable_kernels
    from triton_omni.models import quant
    from triton_omni.models.registry import load_causal_lm

    scheme, lm_head = WEIGHTS[weights]
    torch.manual_seed(seed)
    ref = load_causal_lm(folder, device, dtype, dummy=True)
    q = copy.deepcopy(ref)
    quant.quantize_decoder(q, scheme, lm_head)
    enable_kernels(device, True)
    vocab = ref.config.vocab_size
    prompt = [random.Random(seed).randrange(256, vocab - 1) for _ in range(prompt_len)]
    config = EngineConfig(max_num_seqs=1, max_model_len=prompt_len + 16, max_num_batched_tokens=prompt_len + 16,
                          num_kv_blocks=(prompt_len + 16) // 16 + 2, enforce_eager=True)

    def logits(model, ids):
        engine = LLMEngine(model, config, device, dtype, [], vocab)
        engine.add(ids, SamplingParams(max_tokens=1))
        engine._drain_inbox()
        with torch.inference_mode():
            return engine.runner.prefill_logits(engine.scheduler.schedule().seqs, all_tokens=True)

    stream = lambda out: out[0] + out[1]        # noqa: E731 - a decoder layer returns (x, residual)
    with layer_outputs(ref.model.layers, stream) as seen_ref:
        want = logits(ref, prompt)
    with layer_outputs(q.model.layers, stream) as seen_q:
        got = logits(q, prompt)
    last = len(ref.model.layers) - 1
    pairs = [(name, ref.get_submodule(name), m, name.endswith("down_proj")) for name, m in q.named_modules()
             if isinstance(m, quant.Fp8Linear) and (name.startswith(("model.layers.0.", f"model.layers.{last}."))
                                                     or name == "lm_head")]
    rows = linear_errors(pairs)
    rows += stream_rows([f"layer {i}" for i in range(last + 1)], seen_ref, seen_q)
    rows.append(final_row(f"logits, {prompt_len}-token prefill", got, want, top1=True))
    rows.append(final_row("logits, one row (decode path)", logits(q, prompt[:1]), logits(ref, prompt[:1]), top1=True))
    return rows


# --- diffusion transformers --------------------------------------------------------------------------
def block_pairs(ref, q) -> tuple[list[str], list, list]:
    """The names of a transformer's repeated blocks and the blocks of two copies of it."""
    classes = set(ref._repeated_blocks)
    names = [n for n, m in ref.named_modules() if type(m).__name__ in classes]
    return names, [ref.get_submodule(n) for n in names], [q.get_submodule(n) for n in names]


def block_output(out) -> torch.Tensor:
    """A block's hidden states (FLUX.2's double-stream blocks return text and image states)."""
    return torch.cat([o.flatten() for o in (out if isinstance(out, tuple) else (out,))])


@contextlib.contextmanager
def first_call_outputs(layers):
    """layer_outputs, keeping only each layer's first call (a denoise step's 30 blocks x 8 steps of
    1024² activations would not fit in memory)."""
    seen: list[list[torch.Tensor]] = [[] for _ in layers]

    def keep(i, out):
        if not seen[i]:
            seen[i].append(block_output(out).detach().float().cpu())
    hooks = [m.register_forward_hook(lambda mod, args, out, i=i: keep(i, out)) for i, m in enumerate(layers)]
    try:
        yield seen
    finally:
        for h in hooks:
            h.remove()


@torch.no_grad()
def image_accuracy(ref_transformer, q_transformer, latents_ref, latents_q) -> list[dict]:
    """latents_ref() / latents_q(): the final latents of one request through the denoise step of each
    transformer. Rows: linear layers of the first and last block alone (M = 1 and 4096 rows), each
    block's output at the first transformer call, the final latents."""
    from triton_omni.models import quant

    names, ref_blocks, q_blocks = block_pairs(ref_transformer, q_transformer)
    with first_call_outputs(ref_blocks) as seen_ref:
        want = latents_ref()
    with first_call_outputs(q_blocks) as seen_q:
        got = latents_q()
    ends = (names[0] + ".", names[-1] + ".")
    pairs = [(n, ref_transformer.get_submodule(n), m, False) for n, m in q_transformer.named_modules()
             if isinstance(m, quant.Fp8Linear) and n.startswith(ends)]
    rows = linear_errors(pairs, rows=(1, 4096))
    rows += stream_rows(names, seen_ref, seen_q)
    rows.append(final_row("final latents", got, want))
    return rows
