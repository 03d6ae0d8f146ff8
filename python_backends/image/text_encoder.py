"""The text encoder step shared by the image models: token ids in, prompt embeddings out.

Every row of every request in the batch (the prompt, and the negative prompt where the request
uses guidance) goes through the encoder in one call. A model subclass loads its encoder and says
which hidden states make the embeddings (`encode`).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from python_backends.image.checkpoint import load_component, pipeline_folder
from python_backends.image.tensors import group_by, to_output
from python_backends.runtime.spec import TensorSpec
from python_backends.runtime.step import Request, Step, StepContext


@dataclass
class TextEncoderParams:
    checkpoint: str = ""
    dtype: str = "float32"


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

    def encode(self, ids: np.ndarray, mask: np.ndarray) -> list[torch.Tensor]:
        """[R, L] ids and mask (host arrays) -> one [tokens, D] embedding per row."""
        raise NotImplementedError

    def execute(self, requests: list[Request]) -> list[dict | BaseException]:
        results: list[dict | BaseException | None] = [None] * len(requests)
        items = [(slot, np.asarray(r.get("text_ids")), np.asarray(r.get("text_mask"))) for slot, r in enumerate(requests)]
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
