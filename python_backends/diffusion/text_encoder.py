"""The text encoder step shared by the diffusion models (image and video): token ids in, prompt
embeddings out.

Every row of every request in the batch (the prompt, and the negative prompt where the request uses
guidance) goes through the encoder in one call per padded length. A model subclass says how its
encoder turns ids into embeddings (`encode`: which hidden states, which positions); this base loads
the pipeline's `text_encoder`, checks every request's ids before any work and hands each request its
rows back.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from triton_omni.diffusion.checkpoint import load_component, pipeline_folder
from triton_omni.diffusion.checks import check_ids
from triton_omni.diffusion.tensors import group_by, to_output
from triton_omni.runtime.errors import InvalidInput
from triton_omni.runtime.spec import TensorSpec
from triton_omni.runtime.step import Request, Step, StepContext


@dataclass
class TextEncoderParams:
    checkpoint: str = ""
    dtype: str = "float32"
    compile: bool = False              # GPU: torch.compile the encoder's layers (regional: one compiled layer
                                       #   serves all; a new shape compiles on first use); ignored on CPU
    max_sequence_length: int = 512     # the pre step's: each row's tokens, padding included, at most


class PromptEncoderStep(Step):
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
        self.text_encoder = self.load_encoder()
        self.vocab = self.text_encoder.get_input_embeddings().num_embeddings

    def load_encoder(self) -> torch.nn.Module:
        """The pipeline's `text_encoder` (a model whose transformer reads the ids itself loads that)."""
        return load_component(self.folder, "text_encoder", self.params.dtype, self.device)

    def input_limits(self) -> dict:
        rows = (2, self.params.max_sequence_length)          # prompt, negative
        return {"text_ids": rows, "text_mask": rows}

    def encode(self, ids: np.ndarray, mask: np.ndarray) -> list[torch.Tensor]:
        """[R, L] ids and mask (host arrays) -> one [tokens, D] embedding per row."""
        raise NotImplementedError

    def check(self, ids: np.ndarray, mask: np.ndarray) -> None:
        """A model's own checks of one request's ids and mask (InvalidInput: that request fails alone)."""

    def execute(self, requests: list[Request]) -> list[dict | BaseException]:
        results: list[dict | BaseException | None] = [None] * len(requests)
        items = []
        for slot, r in enumerate(requests):
            ids, mask = np.asarray(r.get("text_ids")), np.asarray(r.get("text_mask"))
            try:
                check_ids(ids, mask, self.vocab)
                self.check(ids, mask)
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
