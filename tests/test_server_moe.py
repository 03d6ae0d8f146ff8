"""A mixture-of-experts chat model on a live tritonserver: qwen3_5_moe_chat (Qwen3.5-MoE: hybrid Gated
DeltaNet + attention, routed experts and a shared expert) streams the text transformers' greedy
`generate` gives on the same tiny checkpoint, and streams decoded together equal one by one."""
from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

from triton_omni.client.chat import ChatClient
from tests.conftest import running_server

pytestmark = pytest.mark.server

MODEL = "qwen3_5_moe_chat"
PROMPTS = ["Write a haiku about the sea.", "Tell me a story about a robot.", "café 中文 🙂 emoji?"]
GREEDY = {"max_tokens": 16, "temperature": 0, "ignore_eos": True}


@pytest.fixture(scope="module")
def server(tmp_path_factory, tiny_checkpoints):
    with running_server(tmp_path_factory.mktemp("moe"), [MODEL], [f"{MODEL}.ar.max_num_seqs=4"]) as s:
        yield s


def chat(server, prompt: str):
    chunks = list(ChatClient(server.grpc_url, timeout_s=60).stream(
        MODEL, messages=[{"role": "user", "content": prompt}], sampling=dict(GREEDY)))
    return "".join(c.text for c in chunks), chunks


def test_streamed_greedy_text_equals_transformers(server, tiny_checkpoints):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder = tiny_checkpoints["qwen3_5_moe"]
    tok, hf = AutoTokenizer.from_pretrained(folder), AutoModelForCausalLM.from_pretrained(folder).eval()
    ids = tok.apply_chat_template([{"role": "user", "content": PROMPTS[0]}], add_generation_prompt=True,
                                  tokenize=True, return_dict=False)
    out = hf.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long), max_new_tokens=16,
                      do_sample=False, eos_token_id=None, pad_token_id=tok.pad_token_id)[0, len(ids):].tolist()
    text, chunks = chat(server, PROMPTS[0])
    assert text == tok.decode(out, skip_special_tokens=True) and len(set(out)) > 3
    assert len(chunks) > 1 and chunks[-1].finish_reason == "length" and chunks[-1].completion_tokens == 16


def test_concurrent_streams_equal_one_by_one(server):
    one_by_one = [chat(server, p)[0] for p in PROMPTS]
    assert len(set(one_by_one)) == len(PROMPTS)
    with ThreadPoolExecutor(len(PROMPTS)) as pool:
        together = list(pool.map(lambda p: chat(server, p)[0], PROMPTS))
    assert together == one_by_one


def test_bad_sampling_fails_that_request_only(server):
    """The MoE ensembles are the chat steps on another checkpoint: bad input is refused by name, and
    the model serves the next request."""
    client = ChatClient(server.grpc_url, timeout_s=60)
    with pytest.raises(Exception, match=r"field 'sampling_parameters.max_tokens': must be > 0"):
        list(client.stream(MODEL, messages=[{"role": "user", "content": "hi"}], sampling={"max_tokens": 0}))
    assert chat(server, PROMPTS[1])[1][-1].completion_tokens == 16
