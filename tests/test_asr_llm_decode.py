"""asr_decode's ordering of a request's segments (asr/llm_decode.py SegmentedTranscript) and the post step's
pieces (asr/llm_post.py): segments that finish out of order still give their text in order, a model's
header ("language English<asr_text>") never reaches the text, streamed pieces join to the text a
request without streaming gets, and silence (no segment) answers once."""
from __future__ import annotations

import json

import numpy as np

from triton_omni.asr.llm_decode import SegmentedTranscript
from triton_omni.runtime.step import ResponseSink

MARKER = 9
# token -> its bytes (byte-level BPE: a leading space is part of the token)
BYTES = [b"", b" hello", b" world", b"again", b" one", b" two", b"language", b" English", b"\xe4", b""]


class Sink(ResponseSink):
    def __init__(self):
        self.sent = []

    def send(self, outputs, final=False):
        self.sent.append((outputs, final))

    def error(self, exc):
        self.sent.append((exc, True))


def reply(ids, context=0, reason=""):
    return {"token_ids": np.asarray(ids), "num_context": np.asarray([context]), "finish_reason": np.asarray([reason])}


def pieces(sink) -> list[tuple[list[int], bool, bool]]:
    out = []
    for o, _ in sink.sent:
        ids, n = o["token_ids"].tolist(), int(o["num_context"][0])
        out.append((ids[n:], bool(o["new_segment"][0]), bool(o["first_text"][0])))
    return out


def test_later_segments_wait_for_earlier_ones_and_headers_stay_out():
    sink = Sink()
    spans = np.asarray([[0, 100, 0, 100], [200, 100, 150, 300]], np.int64)
    t = SegmentedTranscript(sink, [True, False], True, MARKER, BYTES, {"segment_spans": spans})
    one, two = t.sink_of(0), t.sink_of(1)
    two.send(reply([4, 5]))                      # segment 1 streams first: held back
    assert sink.sent == []
    one.send(reply([6, 7]))                      # segment 0's header
    assert sink.sent == []
    one.send(reply([6, 7, MARKER, 1], 2))       # its marker, then text
    two.send(reply([4, 5], 2, "stop"), final=True)      # its end: nothing new
    one.send(reply([1, 2], 1, "stop"), final=True)
    assert pieces(sink)[:3] == [([1], False, True), ([2], False, False), ([4, 5], True, False)]
    final, last = sink.sent[-1]
    assert last and all(not f for _, f in sink.sent[:-1])
    assert final["finish_reason"].tolist() == [b"stop"] and final["segment_token_counts"].tolist() == [2, 2]
    assert final["segment_token_ids"].tolist() == [1, 2, 4, 5]
    assert json.loads(final["segment_headers"][0].decode()) == ["language English", ""]
    assert all(np.array_equal(o["segment_spans"], spans) for o, _ in sink.sent)


def test_without_streaming_one_final_response():
    sink = Sink()
    t = SegmentedTranscript(sink, [False, False], False, None, BYTES, {})
    t.sink_of(1).send(reply([3], 0, "length"), final=True)
    t.sink_of(0).send(reply([1, 2], 0, "stop"), final=True)
    assert len(sink.sent) == 1 and sink.sent[0][1]
    final = sink.sent[0][0]
    assert final["streamed"].tolist() == [False] and final["finish_reason"].tolist() == [b"length"]
    assert final["segment_token_ids"].tolist() == [1, 2, 3]


def test_silence_answers_once():
    sink = Sink()
    SegmentedTranscript(sink, [], True, None, BYTES, {})._finish()
    assert len(sink.sent) == 1 and sink.sent[0][1] and sink.sent[0][0]["segment_token_counts"].tolist() == []
