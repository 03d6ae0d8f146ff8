"""The text encoder step of the image models that encode with a decoder-only LM (Qwen3): the shared
batching of diffusion/text_encoder.py, plus `hidden_states`, which runs the decoder layers only up to
the deepest state asked for (FLUX.2 reads layer 27 of 36, Z-Image the second-to-last state). A model
subclass says which hidden states make the embeddings (`encode`).
"""
from __future__ import annotations

import torch

from triton_omni.diffusion.text_encoder import PromptEncoderStep
from triton_omni.runtime.step import StepContext
from triton_omni.image import warmup as image_warmup


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


class TextEncoderStep(PromptEncoderStep):
    def __init__(self, ctx: StepContext):
        super().__init__(ctx)
        # The base model of a causal LM: the same hidden states, without the vocabulary projection.
        self.base_model = getattr(self.text_encoder, "model", self.text_encoder)
        self.layers = list(self.base_model.layers)
        if self.params.compile and torch.device(self.device).type == "cuda":
            # Wrappers, not Module.compile(): the modules (maybe shared with other users) stay as they
            # are. Per layer rather than the whole function: the mask, rotary tables and the choice of
            # states stay eager, so a new prompt length recompiles one small graph (then as dynamic).
            self.layers = [torch.compile(layer) for layer in self.layers]

    def warmup_inputs(self, spec) -> list[dict]:
        if [t.name for t in self.inputs] != [t.name for t in TextEncoderStep.inputs]:
            return []                  # a model's own inputs (an edit model's image): its own samples
        return image_warmup.text_encoder_samples(self.vocab, self.params.max_sequence_length)

    def hidden_states(self, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                      wanted: list[int]) -> list[torch.Tensor]:
        """The base model's hidden_states[k] for k in `wanted` (see `decoder_hidden_states`)."""
        return decoder_hidden_states(self.base_model, input_ids, attention_mask, wanted, self.layers)
