"""Orpheus TTS (canopylabs): the prompt format and the audio-token layout.

Orpheus is a Llama-3 LM whose tokenizer appends `<custom_token_N>` tokens after the text vocabulary
(id = text vocab size + N; 128256 + N in the release). The ones used here:

    <custom_token_1>  start of speech        <custom_token_4>  end of human
    <custom_token_2>  end of speech (stop)   <custom_token_5>  start of AI
    <custom_token_3>  start of human         <custom_token_10 + k * 4096 + c>  audio: code c, slot k

Prompt (the release's `_format_prompt`, "larger" models):
    [start_of_human] + tokenize(f"{voice}: {text}")  (with <|begin_of_text|>)
    + [<|eot_id|>, end_of_human, start_of_ai, start_of_speech]
The model then streams audio tokens, 7 per frame, until end_of_speech. A frame is one 24 kHz SNAC
step of the coarsest codebook (4 latent steps = 2048 samples, 85 ms): slots 0..6 hold
    codes0[f], codes1[2f], codes2[4f], codes2[4f+1], codes1[2f+1], codes2[4f+2], codes2[4f+3].
Slot k's token encodes its code as id - audio_start - k * codebook_size (the release decoder's
`turn_token_into_id`, with the slot taken from the token's position in the stream).

Assumptions, where the release code is silent or lenient: a token out of its slot's range (the
talker broke the frame pattern) is reduced modulo the codebook size and a non-audio token becomes
code 0, so every frame decodes (the release decoder drops such a 4-frame window instead); a partial
frame at the end is dropped, as in the release decoder.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

TOKENS_PER_FRAME = 7
VOICES = ["tara", "leah", "jess", "leo", "dan", "mia", "zac", "zoe"]     # the English release's voices
# where each of a frame's 7 tokens goes: (codebook, position within the frame's codes of that book)
SLOTS = [(0, 0), (1, 0), (2, 0), (2, 1), (1, 1), (2, 2), (2, 3)]


def custom_token(n: int) -> str:
    return f"<custom_token_{n}>"


@dataclass(frozen=True)
class OrpheusTokens:
    start_of_human: int
    end_of_human: int
    start_of_ai: int
    start_of_speech: int
    end_of_speech: int
    end_of_text: int          # <|eot_id|>
    audio_start: int          # <custom_token_10>: slot 0, code 0

    @classmethod
    def from_tokenizer(cls, tokenizer) -> "OrpheusTokens":
        def tid(token: str) -> int:
            i = tokenizer.convert_tokens_to_ids(token)
            if i is None or i == tokenizer.unk_token_id:
                raise ValueError(f"the tokenizer has no {token!r}: not an Orpheus checkpoint")
            return int(i)

        return cls(tid(custom_token(3)), tid(custom_token(4)), tid(custom_token(5)), tid(custom_token(1)),
                   tid(custom_token(2)), tid("<|eot_id|>"), tid(custom_token(10)))

    def prompt(self, tokenizer, voice: str, text: str) -> list[int]:
        words = tokenizer(f"{voice}: {text}" if voice else text).input_ids
        return [self.start_of_human, *words, self.end_of_text, self.end_of_human, self.start_of_ai,
                self.start_of_speech]


def frames_to_codes(tokens: np.ndarray, audio_start: int, codebook_size: int) -> list[torch.Tensor]:
    """tokens [B, F * 7] (whole frames, stream-aligned) -> SNAC codes [B, F], [B, 2F], [B, 4F]."""
    b, n = tokens.shape
    f = n // TOKENS_PER_FRAME
    t = tokens[:, :f * TOKENS_PER_FRAME].reshape(b, f, TOKENS_PER_FRAME).astype(np.int64) - audio_start
    audio = (t >= 0) & (t < TOKENS_PER_FRAME * codebook_size)
    codes = np.where(audio, t % codebook_size, 0)      # = t - slot * size for a well-formed stream
    books = [np.zeros((b, f, 1 << i), dtype=np.int64) for i in range(3)]
    for slot, (book, pos) in enumerate(SLOTS):
        books[book][:, :, pos] = codes[:, :, slot]
    return [torch.from_numpy(x.reshape(b, -1)) for x in books]
