"""The Qwen3-TTS decoder's stateful streaming (python_backends/tts/qwen3_tts/codec_stream.py) on the tiny
checkpoint: chunks decoded one after another with carried state concatenate to the whole-utterance
decode; streams at different points batch together; each chunk costs only its own frames."""
from __future__ import annotations

import contextlib
from pathlib import Path

import pytest
import torch
from torch import nn

from triton_omni.converters.tiny import build
from triton_omni.tts.qwen3_tts.codec import load_codec
from triton_omni.tts.qwen3_tts.codec_stream import StreamingDecoder, StreamState

ROOT = Path(__file__).resolve().parent.parent
FRAMES = 64                     # > the transformer's window (8) and the receptive field (27 frames) of the tiny config


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """The tiny decoder's ops are too small to gain from threads, and on a busy machine OpenMP's
    spinning threads make this module ~30x slower (40 s instead of 1.3 s)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def codec():
    return load_codec(build(ROOT / "checkpoints" / "tiny", ["qwen3_tts"])["qwen3_tts"])


@pytest.fixture(scope="module")
def stream(codec):
    return StreamingDecoder(codec.decoder)


def _codes(frames: int, seed: int, batch: int = 1) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 2048, (batch, frames, 16), generator=g)


def _streamed(stream: StreamingDecoder, codes: torch.Tensor, chunks: list[int], state=None):
    state = stream.start(codes.shape[0]) if state is None else state
    pieces, s = [], 0
    for n in chunks:
        wave, state = stream.decode(codes[:, s:s + n], state)
        assert wave.shape == (codes.shape[0], n * 1920)
        pieces.append(wave)
        s += n
    return torch.cat(pieces, dim=-1), state


@contextlib.contextmanager
def _onednn(enabled: bool):
    """oneDNN's CPU convolutions round differently with the batch size (the whole decode's too, ~4e-6);
    PyTorch's own do not, so with them off batching must be bit-exact."""
    before = torch.backends.mkldnn.enabled
    torch.backends.mkldnn.enabled = enabled
    try:
        yield
    finally:
        torch.backends.mkldnn.enabled = before


@pytest.fixture(scope="module")
def utterance(codec):
    codes = _codes(FRAMES, 1)
    return codes, codec.decode_window(codes)


@pytest.mark.parametrize("chunks", [[3, 12, 12, 5, 12, 12, 8], [1, 7, 30, 2, 24], [1] * 8 + [56]])
def test_chunks_concatenate_to_the_whole_decode(codec, stream, utterance, chunks):
    assert codec.context_frames()[0] < FRAMES and stream.history == 7
    codes, whole = utterance
    wave, state = _streamed(stream, codes, chunks)
    torch.testing.assert_close(wave, whole, atol=1e-5, rtol=0)
    assert state.pos.tolist() == [FRAMES]


def test_the_state_carries_the_past(stream, utterance):
    """The last 8 frames decoded from a fresh state instead are far off (the check above is not vacuous)."""
    codes, whole = utterance
    fresh, _ = stream.decode(codes[:, -8:], stream.start(1))
    assert (fresh - whole[:, -8 * 1920:]).abs().max() > 1e-2


def test_decode_is_pure_and_reads_padding_codes_as_zero(stream):
    codes = _codes(12, 2)
    _, state = _streamed(stream, codes, [5])
    before = [t.clone() for t in state.tensors()]
    a, after = stream.decode(codes[:, 5:], state)
    b, _ = stream.decode(codes[:, 5:], state)             # the same state again: the same samples
    assert torch.equal(a, b) and all(torch.equal(x, y) for x, y in zip(before, state.tensors()))
    assert after.pos.tolist() == [12]
    # -1 (the reference's padding) decodes as code 0, as decode_window clamps it
    pad = codes[:, 5:].clone()
    pad[:, :, 3] = -1
    zero = pad.clamp(min=0)
    assert torch.equal(stream.decode(pad, state)[0], stream.decode(zero, state)[0])


def test_streams_at_different_points_batch_like_alone(stream):
    """Three streams (40 frames in, 5 in: fewer than the key window, fresh) decode their next 12
    frames together as each does alone: bit for bit where the convolutions' rounding does not depend
    on the batch size (oneDNN off), and within the decoder's own batch-size rounding otherwise."""
    codes = [_codes(52, 10 + i) for i in range(3)]
    done = [40, 5, 0]
    states = [_streamed(stream, c[:, :n], [n])[1] if n else stream.start(1) for c, n in zip(codes, done)]
    nxt = [c[:, n:n + 12] for c, n in zip(codes, done)]
    for exact in (True, False):
        with _onednn(not exact):
            alone = [stream.decode(x, s) for x, s in zip(nxt, states)]
            wave, batched = stream.decode(torch.cat(nxt), StreamState.stack(states))
        tol = dict(atol=0, rtol=0) if exact else dict(atol=1e-5, rtol=1e-5)
        for r, (w, s) in enumerate(alone):
            torch.testing.assert_close(wave[r:r + 1], w, **tol)
            for x, y in zip(batched.split()[r].tensors(), s.tensors()):
                torch.testing.assert_close(x, y, **tol)
        assert batched.pos.tolist() == [52, 17, 12]
    # and each batched row is still its stream's whole decode
    for r, (c, n) in enumerate(zip(codes, done)):
        whole = stream.decoder(c[:, :n + 12].transpose(1, 2))[:, 0]
        torch.testing.assert_close(wave[r], whole[0, n * 1920:], atol=1e-5, rtol=0)


def test_stack_and_split_round_trip(stream):
    codes = _codes(30, 20, batch=2)
    _, two = _streamed(stream, codes, [11])
    _, one = _streamed(stream, codes[:1, :4], [4])
    fresh = stream.start(1)
    batch = StreamState.stack([two, one, fresh])
    assert batch.batch == 4 and batch.pos.tolist() == [11, 11, 4, 0]
    rows = batch.split()
    expect = two.split() + [one, fresh]
    for got, want in zip(rows, expect):
        assert got.batch == 1 and len(got.tensors()) == len(want.tensors())
        assert all(torch.equal(x, y) for x, y in zip(got.tensors(), want.tensors()))
    again = StreamState.stack(rows)
    assert all(torch.equal(x, y) for x, y in zip(again.tensors(), batch.tensors()))
    # split copies: a row's state does not share the batch's storage
    rows[0].keys[0].add_(1)
    assert torch.equal(batch.keys[0][0], two.keys[0][0])
    # the sizes: 7 frames of keys/values per layer, one tensor per conv with a history
    assert [tuple(k.shape) for k in fresh.keys] == [(1, 2, 7, 16)] * 2
    assert len(fresh.convs) == len(stream.conv_shapes) and not any(t.any() for t in fresh.tensors())


class _Samples:
    """Counts the samples each conv of the decoder takes in (their inputs' lengths) and the frames the
    transformer's attention projects."""

    def __init__(self, decoder: nn.Module):
        self.conv = self.attn = 0
        self.hooks = [m.register_forward_hook(self._conv) for m in decoder.modules()
                      if isinstance(m, (nn.Conv1d, nn.ConvTranspose1d))]
        self.hooks += [layer.self_attn.qkv_proj.register_forward_hook(self._attn)
                       for layer in decoder.pre_transformer.layers]

    def _conv(self, m, args, out):
        self.conv += args[0].shape[0] * args[0].shape[-1]

    def _attn(self, m, args, out):
        self.attn += args[0].shape[0] * args[0].shape[1]

    def close(self):
        for h in self.hooks:
            h.remove()


def test_a_chunk_costs_its_own_frames_only(codec, stream):
    """A 12-frame chunk deep into a stream takes in exactly what a fresh 12-frame decode does (whose
    convs see zero padding where the stream's see history), plus one input frame per transposed conv
    with an overlap (the 4 decoder blocks'); a window re-decode with the receptive field's left context
    takes ~3x as many samples, and projects the context frames in every transformer layer again."""
    left = codec.context_frames()[0]
    codes = _codes(left + 13, 30)
    _, state = _streamed(stream, codes[:, :left + 1], [left + 1])
    counts = {}
    for name, run in [("stream", lambda: stream.decode(codes[:, -12:], state)),
                      ("fresh", lambda: codec.decode_window(codes[:, -12:])),
                      ("window", lambda: codec.decode_window(codes[:, -12 - left:]))]:
        hooks = _Samples(codec.decoder)
        run()
        hooks.close()
        counts[name] = (hooks.conv, hooks.attn)
    assert counts["stream"] == (counts["fresh"][0] + 4, 2 * 12)
    assert counts["window"][0] > 3 * counts["stream"][0] and counts["window"][1] == 2 * (12 + left)
