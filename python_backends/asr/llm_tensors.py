"""The tensors between the steps of the speech-recognition models with an LLM decoder (pre -> encoder ->
asr_decode -> post), declared once for the steps on both sides of each."""
from __future__ import annotations

from triton_omni.runtime.spec import TensorSpec

# pre -> encoder, asr_decode
INPUT_IDS = TensorSpec("input_ids", "TYPE_INT32", (-1,))          # every segment's prompt, one after another
PROMPT_LENS = TensorSpec("prompt_lens", "TYPE_INT32", (-1,))      # tokens per segment's prompt
SAMPLING = TensorSpec("sampling", "TYPE_STRING", (1,))            # resolved sampling parameters (JSON)
# encoder -> asr_decode: one row per audio placeholder of the prompts, in order
PROMPT_EMBEDS = TensorSpec("prompt_embeds", "TYPE_FP32", (-1, -1))
# asr_decode -> post (asr/llm_decode.py says what each holds)
DECODE_OUTPUTS = (
    TensorSpec("token_ids", "TYPE_INT32", (-1,)),
    TensorSpec("num_context", "TYPE_INT32", (1,)),
    TensorSpec("new_segment", "TYPE_BOOL", (1,)),
    TensorSpec("first_text", "TYPE_BOOL", (1,)),
    TensorSpec("streamed", "TYPE_BOOL", (1,)),
    TensorSpec("finish_reason", "TYPE_STRING", (1,)),
    TensorSpec("segment_token_ids", "TYPE_INT32", (-1,)),
    TensorSpec("segment_token_counts", "TYPE_INT32", (-1,)),
    TensorSpec("segment_headers", "TYPE_STRING", (1,)),
)
# pre's tensors that post reads, passed through asr_decode in every response: Triton refuses an ensemble
# step whose inputs come from both a decoupled step and one before it
PASSED_ON = ("segment_spans", "transcription")
