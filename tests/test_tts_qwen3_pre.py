"""The served Qwen3-TTS pre step (python_backends/tts/qwen3_tts/serve.py) on the tiny checkpoints, no server:
`language` and `instructions` become the talker's inputs, and the prompt length pre budgets the text
against is the length of the prompt the talker builds from them (language tag, dialect speakers,
instruction tokens)."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from triton_omni.converters.tiny import build
from triton_omni.runtime.errors import InvalidInput
from triton_omni.runtime.step import Request, StepContext, string_array
from triton_omni.text.tokenizer import load_tokenizer
from triton_omni.tts.qwen3_tts.model import instruct_text, load_qwen3_tts
from triton_omni.tts.qwen3_tts.serve import Qwen3TTSPre, Qwen3TTSPreParams

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def folders() -> dict[str, Path]:
    return build(ROOT / "checkpoints" / "tiny", ["qwen3_tts", "qwen3_tts_1b7"])


def pre(folder: Path) -> Qwen3TTSPre:
    return Qwen3TTSPre(StepContext("qwen3_tts_pre", Qwen3TTSPreParams(checkpoint=str(folder), max_model_len=256),
                                   "cpu", folder.parent, log=lambda _: None))


def request(**values) -> Request:
    return Request({k: string_array(v) for k, v in {"text": "Hello there.", **values}.items()})


CASES = [("qwen3_tts", {}), ("qwen3_tts", {"language": "German"}), ("qwen3_tts", {"voice": "eric"}),
         ("qwen3_tts", {"voice": "dylan", "language": "english"}),
         ("qwen3_tts_1b7", {"instructions": "Speak slowly and warmly."}),
         ("qwen3_tts_1b7", {"instructions": "A deep, calm voice.", "language": "chinese", "voice": "eric"})]


@pytest.mark.parametrize("variant,values", CASES, ids=[f"{v}-{'-'.join(x.values()) or 'auto'}" for v, x in CASES])
def test_talker_inputs_and_prompt_length(folders, variant, values):
    folder = folders[variant]
    step = pre(folder)
    out = step.one(request(**values))
    language = values.get("language", "auto").lower()
    assert out["language"].reshape(-1)[0] in (language, language.encode())
    tokenizer = load_tokenizer(folder)
    want = tokenizer(instruct_text(values["instructions"]))["input_ids"] if "instructions" in values else []
    assert out["instruct_ids"].tolist() == want
    model = load_qwen3_tts(folder)
    speaker = values.get("voice", "vivian")
    with torch.no_grad():
        prompt = model.build_prompt(out["input_ids"].tolist(), language, speaker, want or None)
    sampling = json.loads(out["sampling"].reshape(-1)[0])
    text_len = len(out["input_ids"]) - 8
    # pre's budget for the frames: the context less the prompt the talker builds
    assert sampling["max_tokens"] == 256 - len(prompt)
    assert len(prompt.trailing) == text_len        # the rest of the text (and its end) streams one per frame


def test_instructions_and_languages_refused_where_the_model_has_none(folders):
    step = pre(folders["qwen3_tts"])                 # 0.6B: the reference drops instructions; we refuse them
    with pytest.raises(InvalidInput, match="field 'instructions': this model takes no instructions"):
        step.one(request(instructions="Speak slowly."))
    with pytest.raises(InvalidInput, match="field 'language': unknown language 'klingon'; known: auto"):
        step.one(request(language="Klingon"))
    assert np.asarray(step.one(request(language="  "))["language"]).reshape(-1)[0] in ("auto", b"auto")
