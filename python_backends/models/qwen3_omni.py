"""Qwen3-Omni's thinker decoder for the AR engine: the text model of `Qwen3OmniMoeForConditionalGeneration`
(`thinker.model.*`, `thinker.lm_head.*`), which is Qwen3-MoE's layer (RMSNorm per head on q and k, sparse
MoE MLP, models/qwen3_moe.py) under the interleaved multimodal rope.

Rotary: transformers' thinker recomposes the (t, h, w) frequencies interleaved (frequency i takes height
if i % 3 == 1 and i < 3 s_h, width if i % 3 == 2 and i < 3 s_w, else time) whatever the config's
`mrope_interleaved` says, so it is forced here. For text and audio every axis carries the token's index
(`get_rope_index` gives 1-D positions unless an image or video grid is present): the 1-D rope exactly,
with no rope_positions sent. The audio tower (thinker.audio_tower.*) runs in omni/, the vision tower,
the talker and code2wav are not loaded here.
"""
from __future__ import annotations

import copy

from triton_omni.models.qwen3_moe import Qwen3MoeForCausalLM


class Qwen3OmniThinkerForCausalLM(Qwen3MoeForCausalLM):
    rename = {"thinker.model.": "model.", "thinker.lm_head.": "lm_head."}
    skip_prefixes = ("thinker.audio_tower.", "thinker.visual.", "talker.", "code2wav.")

    def __init__(self, config):
        params = dict(getattr(config, "rope_parameters", None) or {})
        if params.get("mrope_section"):
            config = copy.copy(config)
            config.rope_parameters = {**params, "mrope_interleaved": True}
        super().__init__(config)
