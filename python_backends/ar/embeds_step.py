"""The AR step for prompts with spliced embeddings: `ar_decode` plus the rows an earlier step computed
for the prompt's placeholder tokens (a vision tower's image and video embeddings, an audio encoder's
outputs) and, for a multimodal rotary, the prompt's rotary positions. ar/prompt_embeds.py says how
the engine runs them.

Inputs besides ar_decode's (one request's; both optional, a text-only prompt sends neither):
    prompt_embeds   FP32 [rows, hidden]   one row per placeholder token of input_ids, in prompt order
    rope_positions  INT32 [axes, tokens]  each prompt token's rotary position per axis
Placeholder tokens are the ids of `placeholder_token_ids`, by default the checkpoint config's
image/video/audio token ids. The rows may be a GPU tensor (a GPU step's output): they stay there.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field

import numpy as np
import torch

from triton_omni.ar.engine import LLMEngine
from triton_omni.ar.prompt_embeds import PromptEmbeds, placeholder_index
from triton_omni.ar.step import ARDecode, ARParams
from triton_omni.runtime.errors import InvalidInput
from triton_omni.runtime.spec import TensorSpec
from triton_omni.runtime.step import Request, register

# config.json keys (top level or the text config) that name a placeholder token
PLACEHOLDER_KEYS = ("image_token_id", "video_token_id", "audio_token_id")
MAX_ROPE_AXES = 4


def placeholder_ids(folder) -> list[int]:
    """The checkpoint's placeholder token ids (config.json and its text_config)."""
    config = json.loads((folder / "config.json").read_text())
    config = config.get("thinker_config") or config          # Qwen3-Omni keeps them in its thinker's config
    ids = {config[k] for k in PLACEHOLDER_KEYS if isinstance(config.get(k), int)}
    text = config.get("text_config") or {}
    ids |= {text[k] for k in PLACEHOLDER_KEYS if isinstance(text.get(k), int)}
    return sorted(ids)


@dataclass
class EmbedsARParams(ARParams):
    placeholder_token_ids: list[int] = field(default_factory=list)   # []: the checkpoint config's


@register("ar_decode_embeds")
class ARDecodeWithEmbeds(ARDecode):
    inputs = ARDecode.inputs + (
        TensorSpec("prompt_embeds", "TYPE_FP32", (-1, -1), optional=True),
        TensorSpec("rope_positions", "TYPE_INT32", (-1, -1), optional=True),
    )
    Params = EmbedsARParams

    spliced_prompts = True

    def make_engine(self, folder) -> LLMEngine:
        self.placeholders = self.params.placeholder_token_ids or placeholder_ids(folder)
        return super().make_engine(folder)

    def input_limits(self) -> dict:
        n = self.params.max_model_len
        return {**super().input_limits(), "prompt_embeds": (n, None), "rope_positions": (MAX_ROPE_AXES, n)}

    def prompt_embeds(self, request: Request, ids) -> PromptEmbeds | None:
        rows, rope = request.get("prompt_embeds"), request.get("rope_positions")
        index = placeholder_index(np.asarray(ids), self.placeholders)
        if rows is None and rope is None and not index.size:
            return None
        if rows is None:
            if index.size:
                raise InvalidInput("prompt_embeds", f"the prompt has {index.size} placeholder tokens and no rows for them")
            rows = np.zeros((0, self.engine.runner.hidden_size), np.float32)
        rows = rows if isinstance(rows, torch.Tensor) else torch.from_numpy(np.asarray(rows))
        if rope is not None:
            rope = (rope.cpu().numpy() if isinstance(rope, torch.Tensor) else np.asarray(rope)).astype(np.int64)
        return PromptEmbeds(rows, index, rope)
