"""Token release rules (whole UTF-8 characters, stop strings), the stateless detokenizer and the chat
pre step's batched tokenization."""
from __future__ import annotations

import json
import random

import numpy as np
import pytest

from triton_omni.text.stream import TokenStream, utf8_pending
from triton_omni.text.tokenizer import load_tokenizer, token_byte_table


def test_utf8_pending():
    s = "a中🙂".encode()
    assert utf8_pending(s) == 0
    assert utf8_pending(s[:-1]) == 3 and utf8_pending(s[:-3]) == 1
    assert utf8_pending(s[:2]) == 1 and utf8_pending(s[:3]) == 2
    assert utf8_pending(b"\x80\x80") == 0       # stray continuation bytes: invalid, complete


TABLE = [b"a", b"\xe4", b"\xb8\xad", b"b\xf0\x9f", b"\x99\x82", b"END", b"E", b"ND", b"\n", b""]


def test_release_waits_for_whole_characters():
    s = TokenStream(TABLE, [])
    assert s.push([0, 1]) == ([0], None)          # "a" out, the lead byte of 中 held
    assert s.push([2]) == ([1, 2], None)
    assert s.push([3]) == ([], None)              # "b" shares a token with half of 🙂
    assert s.push([4]) == ([3, 4], None)
    s.push([1])
    assert s.flush() == [1]


def test_stop_string_spanning_tokens_is_held_then_reported():
    s = TokenStream(TABLE, ["END"])
    assert s.push([0, 6]) == ([0], None)          # "E" could start "END": held
    assert s.push([7]) == ([6, 7], "END")
    s = TokenStream(TABLE, ["END"])
    assert s.push([6, 8]) == ([6, 8], None)       # "E\n" cannot start END any more


@pytest.fixture(scope="module")
def tokenizer(tiny_checkpoints):
    return load_tokenizer(tiny_checkpoints["qwen3"])


def test_byte_table_matches_the_tokenizer(tokenizer):
    table = token_byte_table(tokenizer)
    text = "Unicode: café naïve 中文 🙂🚀 end"
    ids = tokenizer.encode(text, add_special_tokens=False)
    assert b"".join(table[i] for i in ids).decode() == text
    for special in tokenizer.all_special_ids:
        assert table[special] == b""


def test_streamed_pieces_reassemble_exactly(tokenizer):
    """Random token streams, released by TokenStream and decoded as the post step does,
    concatenate to the same text as decoding everything at once, and no piece holds half a char."""
    from triton_omni.text.chat import Detokenize

    table = token_byte_table(tokenizer)
    detok = Detokenize.__new__(Detokenize)
    detok.tokenizer = tokenizer
    rng = random.Random(0)
    for trial in range(30):
        ids = [rng.randrange(len(tokenizer)) for _ in range(40)]
        stream, context, pieces = TokenStream(table, []), [], []
        for t in ids:
            out, _ = stream.push([t])
            if out:
                pieces.append(detok.text(context + out, len(context), ""))
                context = (context + out)[-4:]
        rest = stream.flush()
        if rest:
            pieces.append(detok.text(context + rest, len(context), ""))
        assert "".join(pieces) == tokenizer.decode(ids, skip_special_tokens=True), trial


def test_chat_pre_batch_equals_one_by_one_and_keeps_errors_apart(tokenizer):
    """The pre step tokenizes a batch in one call: each request gets the ids it gets alone (text and
    chat template alike), and a bad request in the batch fails alone, naming its field."""
    from triton_omni.ar.sampling import SamplingParams
    from triton_omni.runtime.errors import InvalidInput
    from triton_omni.runtime.step import Request
    from triton_omni.text.chat import ChatPreParams, ChatPreprocess

    from triton_omni.text.channels import MarkerIds

    pre = ChatPreprocess.__new__(ChatPreprocess)
    pre.tokenizer, pre.params = tokenizer, ChatPreParams(max_model_len=64)
    pre.defaults, pre.markers, pre._grammar = SamplingParams(), MarkerIds.of(tokenizer), None
    s = lambda v: np.array([json.dumps(v) if not isinstance(v, str) else v], dtype=np.object_)  # noqa: E731
    msgs = [{"role": "user", "content": "héllo 中文 🙂"}]
    good = [Request({"text_input": s("café naïve 🚀 end")}),
            Request({"messages": s(msgs), "sampling_parameters": s({"max_tokens": 5})}),
            Request({"text_input": s("x")})]
    bad = [Request({"text_input": s("")}),                                              # empty
           Request({"text_input": s("word " * 80)}),                                   # longer than the context
           Request({"messages": s(msgs), "sampling_parameters": s({"top_p": 3})})]    # bad sampling
    out = pre.execute([bad[0], good[0], bad[1], good[1], bad[2], good[2]])
    expect = [tokenizer.encode("café naïve 🚀 end", add_special_tokens=False),
              list(tokenizer.apply_chat_template(msgs, add_generation_prompt=True, tokenize=True, return_dict=False)),
              tokenizer.encode("x", add_special_tokens=False)]
    for got, ids in zip(out[1::2], expect):
        assert got["input_ids"].tolist() == ids
    assert json.loads(out[3]["sampling"][0])["max_tokens"] == 5
    for got, field in zip(out[0::2], ["text_input", "prompt", "sampling_parameters.top_p"]):
        assert isinstance(got, InvalidInput) and f"field '{field}'" in str(got), got
    # resolved once, here: the default max_tokens is what the context leaves, and a seed is drawn
    resolved = SamplingParams.from_resolved(json.loads(out[1]["sampling"][0]))
    assert resolved.resolved and resolved.max_tokens == 64 - len(expect[0])      # left out: the rest of the context
