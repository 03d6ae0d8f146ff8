"""The text encoder step shared by the image models: token ids in, prompt embeddings out.

Every row of every request in the batch (the prompt, and the negative prompt where the request
uses guidance) goes through the encoder in one call. A model subclass loads its encoder and says
which hidden states make the embeddings (`encode`); `hidden_states` runs the decoder layers only up
to the deepest state asked for (FLUX.2 reads layer 27 of 36, Z-Image the second-to-last state).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from triton_omni.image import warmup as image_warmup
from triton_omni.image.checkpoint import load_component, pipeline_folder
from triton_omni.image.checks import check_ids
from triton_omni.image.tensors import group_by, to_output
from triton_omni.runtime.errors import InvalidInput
from triton_omni.runtime.spec import TensorSpec
from triton_omni.runtime.step import Request, Step, StepContext


@dataclass
class TextEncoderParams:
    checkpoint: str = ""
    dtype: str = "float32"
    compile: bool = False              # GPU: torch.compile each decoder layer (regional: one compiled layer
                                       #   serves all; a new shape compiles on first use); ignored on CPU
    max_sequence_length: int = 512     # the pre step's: each row's tokens, padding included, at most


def decoder_hidden_states(model, input_ids: torch.Tensor, attention_mask: torch.Tensor, wanted: list[int],
                          layers=None) -> list[torch.Tensor]:
    """`model(input_ids, attention_mask, output_hidden_states=True).hidden_states[k]` for each k in
    `wanted`, bit for bit, for a transformers decoder-only base model (Qwen3Model and kin), running
    only the layers up to the deepest k: transformers' forward, step by step. Its hidden_states[0]
    is the embedding, [i] the output of layer i - 1, and the last one (index num_hidden_layers)
    the output after the final norm. `layers`: callables run in place of `model.layers` (compiled)."""
    from transformers.masking_utils import create_causal_mask, create_sliding_window_causal_mask

    n = model.config.num_hidden_layers
    if any(not -(n + 1) <= k <= n for k in wanted):
        raise ValueError(f"hidden state indices {wanted} out of range for {n} layers")
    wanted = [k % (n + 1) for k in wanted]
    depth = max(wanted)
    h = model.embed_tokens(input_ids)
    position_ids = torch.arange(h.shape[1], device=h.device).unsqueeze(0)
    kw = dict(config=model.config, inputs_embeds=h, attention_mask=attention_mask, cache=None,
              position_ids=position_ids)
    masks = {"full_attention": create_causal_mask(**kw)}
    if getattr(model, "has_sliding_layers", False):
        masks["sliding_attention"] = create_sliding_window_causal_mask(**kw)
    position_embeddings = model.rotary_emb(h, position_ids)
    states = {0: h}
    for i, layer in enumerate((model.layers if layers is None else layers)[:depth]):
        h = layer(h, attention_mask=masks[model.config.layer_types[i]], position_ids=position_ids,
                  position_embeddings=position_embeddings)
        if i + 1 in wanted:
            states[i + 1] = h
    if depth == n:
        states[n] = model.norm(h)
    return [states[k] for k in wanted]


class TextEncoderStep(Step):
    inputs = (
        TensorSpec("text_ids", "TYPE_INT32", (-1, -1), ragged=True),     # [rows, L]: prompt (, negative)
        TensorSpec("text_mask", "TYPE_INT32", (-1, -1), ragged=True),
    )
    outputs = (
        TensorSpec("prompt_embeds", "TYPE_FP32", (-1, -1)),
        TensorSpec("negative_embeds", "TYPE_FP32", (-1, -1)),   # zero rows when the request has no CFG
    )
    Params = TextEncoderParams

    def __init__(self, ctx: StepContext):
        super().__init__(ctx)
        self.device = ctx.device
        self.folder = pipeline_folder(ctx, self.params.checkpoint)
        self.text_encoder = load_component(self.folder, "text_encoder", self.params.dtype, self.device)
        # The base model of a causal LM: the same hidden states, without the vocabulary projection.
        self.base_model = getattr(self.text_encoder, "model", self.text_encoder)
        self.layers = list(self.base_model.layers)
        self.vocab = self.base_model.embed_tokens.num_embeddings
        if self.params.compile and torch.device(self.device).type == "cuda":
            # Wrappers, not Module.compile(): the modules (maybe shared with other users) stay as they
            # are. Per layer rather than the whole function: the mask, rotary tables and the choice of
            # states stay eager, so a new prompt length recompiles one small graph (then as dynamic).
            self.layers = [torch.compile(layer) for layer in self.layers]

    def input_limits(self) -> dict:
        rows = (2, self.params.max_sequence_length)          # prompt, negative
        return {"text_ids": rows, "text_mask": rows}

    def warmup_inputs(self, spec) -> list[dict]:
        if [t.name for t in self.inputs] != [t.name for t in TextEncoderStep.inputs]:
            return []                  # a model's own inputs (an edit model's image): its own samples
        return image_warmup.text_encoder_samples(self.vocab, self.params.max_sequence_length)

    def hidden_states(self, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                      wanted: list[int]) -> list[torch.Tensor]:
        """The base model's hidden_states[k] for k in `wanted` (see `decoder_hidden_states`)."""
        return decoder_hidden_states(self.base_model, input_ids, attention_mask, wanted, self.layers)

    def encode(self, ids: np.ndarray, mask: np.ndarray) -> list[torch.Tensor]:
        """[R, L] ids and mask (host arrays) -> one [tokens, D] embedding per row."""
        raise NotImplementedError

    def execute(self, requests: list[Request]) -> list[dict | BaseException]:
        results: list[dict | BaseException | None] = [None] * len(requests)
        items = []
        for slot, r in enumerate(requests):
            ids, mask = np.asarray(r.get("text_ids")), np.asarray(r.get("text_mask"))
            try:
                check_ids(ids, mask, self.vocab)
                items.append((slot, ids, mask))
            except InvalidInput as exc:          # this request fails alone
                results[slot] = exc
        for group in group_by(items, lambda it: it[1].shape[1]).values():
            try:
                with torch.inference_mode():
                    rows = self.encode(np.concatenate([it[1] for it in group]), np.concatenate([it[2] for it in group]))
                at = 0
                for slot, ids, _ in group:
                    mine, at = rows[at:at + len(ids)], at + len(ids)
                    negative = mine[1] if len(mine) > 1 else mine[0].new_zeros((0, mine[0].shape[-1]))
                    results[slot] = {"prompt_embeds": to_output(mine[0].float()),
                                     "negative_embeds": to_output(negative.float())}
            except Exception as exc:  # noqa: BLE001 - this group fails, the others go on
                for slot, _, _ in group:
                    results[slot] = exc
        return results
