"""Kokoro's text front end, offline: text -> phonemes (IPA in Kokoro's symbols) -> segments.

Kokoro reads phonemes, not text. The release's front end (misaki) phonemizes English with a
lexicon and a spaCy model that it downloads at run time, which this server cannot do. So:

- A request may pass `phonemes`: IPA in Kokoro's vocabulary (config.json `vocab`), used as given.
  This is the way to the release's exact pronunciation: phonemize with misaki elsewhere and send
  the result. Symbols outside the vocabulary are refused, naming them.
- Otherwise the text goes through espeak-ng (the Debian package `espeak-ng`; scripts/setup.sh
  installs it where it can) in the voice's language, chosen as the release does by the voice
  name's first letter (a: American English, b: British English, e: Spanish, f: French, h: Hindi,
  i: Italian, p: Brazilian Portuguese), and its IPA is mapped to Kokoro's symbols the way misaki
  maps espeak's output for the words its lexicon lacks. Other languages (j, z: misaki's own
  Japanese and Chinese front ends) need `phonemes`. Without espeak-ng on the server, text is
  refused (INVALID_ARG) with a message asking for `phonemes`.

Punctuation carries prosody in Kokoro but espeak drops it, so the text is cut at punctuation, the
pieces phonemized one by one, and the marks put back. A phoneme string longer than the model's 510
is cut into segments at sentence ends, else at clause marks, else at spaces; each is spoken alone.
"""
from __future__ import annotations

import re
import shutil
import subprocess

from triton_omni.runtime.errors import InvalidInput
from triton_omni.tts.kokoro.model import MAX_PHONEMES

LANGUAGES = {"a": "en-us", "b": "en-gb", "e": "es", "f": "fr-fr", "h": "hi", "i": "it", "p": "pt-br"}
PUNCTUATION = re.compile(r'([;:,.!?—…"()“”]+)')
FLAGS = re.compile(r"\([^)]*\)")             # espeak's language-switch marks, e.g. "(en)"
SENTENCE_ENDS, CLAUSE_MARKS = ".!?…", ",;:—"

# espeak's IPA (multi-letter phonemes tied with ^) -> Kokoro's symbols; each table applies in order.
US = [("o^ʊ", "O"), ("ɜːɹ", "ɜɹ"), ("ɜː", "ɜɹ"), ("ɪə", "iə")]
GB = [("e^ə", "ɛː"), ("iə", "ɪə"), ("ə^ʊ", "Q")]
ENGLISH = [("ʔˌn\u0329", "ʔn"), ("ʔn\u0329", "ʔn"), ("a^ɪ", "I"), ("a^ʊ", "W"), ("d^ʒ", "ʤ"), ("e^ɪ", "A"),
           ("t^ʃ", "ʧ"), ("ɔ^ɪ", "Y"), ("ə^l", "ᵊl"), ("ʲo", "jo"), ("ʲə", "jə"), ("ʲ", ""), ("ɚ", "əɹ"),
           ("r", "ɹ"), ("x", "k"), ("ç", "k"), ("ɐ", "ə"), ("ɬ", "l"), ("\u0303", ""), ("e", "A")]
ENGLISH_LAST = [("o", "ɔ"), ("ɾ", "T"), ("ʔ", "t"), ("^", "")]    # espeak 1.51 writes o for ɔ; T: the flap
OTHER = [("a^ɪ", "I"), ("a^ʊ", "W"), ("d^z", "ʣ"), ("d^ʒ", "ʤ"), ("e^ɪ", "A"), ("o^ʊ", "O"), ("ə^ʊ", "Q"),
         ("s^s", "S"), ("t^s", "ʦ"), ("t^ʃ", "ʧ"), ("ɔ^ɪ", "Y"), ("^", ""), ("-", "")]


def _replace(text: str, table: list[tuple[str, str]]) -> str:
    for old, new in table:
        text = text.replace(old, new)
    return text


def to_kokoro(ipa: str, language: str) -> str:
    """espeak's IPA for one piece of text -> Kokoro's symbols (before the vocabulary filter)."""
    ipa = FLAGS.sub("", ipa)
    if not language.startswith("en"):
        return _replace(ipa, OTHER)
    ipa = _replace(ipa, US if language == "en-us" else GB)
    ipa = _replace(ipa, ENGLISH)
    ipa = re.sub(r"(\S)\u0329", r"ᵊ\1", ipa).replace("\u0329", "")      # syllabic consonants
    if language == "en-us":
        ipa = ipa.replace("ː", "")
    return _replace(ipa, ENGLISH_LAST)


class Phonemizer:
    """Text -> Kokoro phonemes through the espeak-ng program."""

    def __init__(self, vocab: dict[str, int], binary: str = "espeak-ng"):
        self.vocab = vocab
        self.binary = shutil.which(binary)

    def espeak(self, text: str, language: str) -> str:
        out = subprocess.run([self.binary, "-q", "--ipa", "--tie=^", "-v", language, "--stdin"], input=text,
                             capture_output=True, encoding="utf-8", timeout=60, check=True).stdout
        return " ".join(line.strip() for line in out.splitlines() if line.strip())

    def __call__(self, text: str, voice: str) -> str:
        language = LANGUAGES.get(voice[:1])
        if language is None:
            raise InvalidInput("text", f"voice {voice!r} has no offline phonemizer for its language; "
                                       "pass `phonemes` (IPA in the model's vocabulary) instead")
        if self.binary is None:
            raise InvalidInput("text", "this server cannot turn text into phonemes (espeak-ng is not "
                                       "installed); pass `phonemes` (IPA in the model's vocabulary) instead")
        out = ""
        for piece in PUNCTUATION.split(text):
            if PUNCTUATION.fullmatch(piece):
                out += piece
            elif piece:
                spoken = to_kokoro(self.espeak(piece, language), language) if piece.strip() else ""
                lead = " " if piece[0].isspace() else ""
                trail = " " if piece[-1].isspace() else ""
                out += lead + spoken + trail
        # espeak may write symbols Kokoro lacks: dropped, as the release's model drops them
        out = "".join(c for c in out if c in self.vocab)
        return re.sub(r"\s+", " ", out).strip()


def check_phonemes(phonemes: str, vocab: dict[str, int]) -> str:
    """A request's own phonemes: every symbol must be in the vocabulary."""
    unknown = sorted({c for c in phonemes if c not in vocab and not c.isspace()})
    if unknown:
        raise InvalidInput("phonemes", f"symbols not in the model's vocabulary: {' '.join(map(repr, unknown))}")
    return re.sub(r"\s+", " ", phonemes).strip()


def segments(phonemes: str, limit: int = MAX_PHONEMES) -> list[str]:
    """Cut a phoneme string into pieces of at most `limit` symbols, at the latest sentence end that
    fits, else clause mark, else space, else anywhere."""
    out, rest = [], phonemes.strip()
    while len(rest) > limit:
        head = rest[:limit + 1]             # a mark followed by a space within it fits
        cut = max(head.rfind(m + " ") for m in SENTENCE_ENDS) + 1
        if cut <= 1:
            cut = max(head.rfind(m + " ") for m in CLAUSE_MARKS) + 1
        if cut <= 1:
            cut = head.rfind(" ")
        if cut <= 0:
            cut = limit
        out.append(rest[:cut].strip())
        rest = rest[cut:].strip()
    return out + ([rest] if rest else [])
