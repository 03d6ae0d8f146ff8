"""Text embeddings from an embedding checkpoint's hidden states (the `text_embed` step).

Meaningful for checkpoints trained to be read this way, such as Qwen3-Embedding (0.6B/4B/8B: a Qwen3
base model whose last token's final hidden state, L2-normalised, is the embedding; its tokenizer ends
every text with <|endoftext|>), not for a chat model's hidden states, which no training made
comparable across texts. `pooling` says how a checkpoint reads them: "last" (Qwen3-Embedding,
gte-Qwen2) or "mean" (over the text's tokens). The whole batch runs as one left-padded call of the
checkpoint's transformers model (AutoModel).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from triton_omni.runtime.errors import InvalidInput
from triton_omni.runtime.params import torch_dtype
from triton_omni.runtime.spec import TensorSpec
from triton_omni.runtime.step import Request, Step, StepContext, register
from triton_omni.text.tokenizer import load_tokenizer

POOLING = ("last", "mean")


@dataclass
class TextEmbedParams:
    checkpoint: str = ""
    dtype: str = "float32"
    pooling: str = "last"
    normalize: bool = True
    max_tokens: int = 8192            # a longer text is refused (naming the field), not cut
    max_text_bytes: int = 1 << 20


def pool(hidden: torch.Tensor, mask: torch.Tensor, pooling: str) -> torch.Tensor:
    """hidden [B, L, D] of left-padded rows, mask [B, L] -> [B, D]."""
    if pooling == "last":
        return hidden[:, -1]
    m = mask[..., None].to(hidden.dtype)
    return (hidden * m).sum(1) / m.sum(1).clamp(min=1)


@register("text_embed")
class TextEmbed(Step):
    inputs = (TensorSpec("text", "TYPE_STRING", (1,)),)
    outputs = (TensorSpec("embedding", "TYPE_FP32", (-1,)), TensorSpec("prompt_tokens", "TYPE_INT32", (1,)))
    Params = TextEmbedParams

    def __init__(self, ctx: StepContext):
        super().__init__(ctx)
        from transformers import AutoModel

        if self.params.pooling not in POOLING:
            raise ValueError(f"parameter 'pooling': expected one of {POOLING}, got {self.params.pooling!r}")
        folder = ctx.checkpoint(self.params.checkpoint)
        self.tokenizer = load_tokenizer(folder)
        self.tokenizer.padding_side = "left"           # the last position is every row's last token
        self.model = AutoModel.from_pretrained(str(folder), local_files_only=True,
                                               dtype=torch_dtype(self.params.dtype)).to(ctx.device).eval()

    def job(self, req: Request) -> list[int]:
        text = req.string("text")
        if not text:
            raise InvalidInput("text", "is empty")
        if len(text.encode()) > self.params.max_text_bytes:
            raise InvalidInput("text", f"more than {self.params.max_text_bytes} bytes")
        ids = self.tokenizer(text)["input_ids"]
        if len(ids) > self.params.max_tokens:
            raise InvalidInput("text", f"{len(ids)} tokens; at most {self.params.max_tokens} are accepted")
        return ids

    def execute(self, requests: list[Request]) -> list:
        return self.execute_jobs(requests, self.run)

    def run(self, requests: list[Request], jobs: list[list[int]]):
        batch = self.tokenizer.pad({"input_ids": jobs}, return_tensors="pt")
        with torch.inference_mode():
            ids, mask = batch["input_ids"].to(self.ctx.device), batch["attention_mask"].to(self.ctx.device)
            hidden = self.model(input_ids=ids, attention_mask=mask).last_hidden_state
            out = pool(hidden, mask, self.params.pooling).float()
            if self.params.normalize:
                out = torch.nn.functional.normalize(out, dim=-1)
        for row, ids in zip(out.cpu().numpy(), jobs):
            yield {"embedding": row, "prompt_tokens": np.asarray([len(ids)], np.int32)}
