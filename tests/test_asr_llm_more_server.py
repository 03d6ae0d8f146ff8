"""omniasr_llm and higgs_audio on one live tritonserver with real speech (espeak-ng): Omnilingual ASR's
LLM variant against transformers' OmniASRForConditionalGeneration.generate on the same decoded audio;
Higgs Audio transcribing and translating (`task`, and the proxy's /v1/audio/translations with the
`openai` SDK), streamed and not. The decoders are capped at a few tokens a segment."""
from __future__ import annotations

import numpy as np
import openai
import pytest
import torch

from triton_omni.client.transcribe import TranscribeClient
from triton_omni.media import audio
from tests.asr_audio import espeak_wav
from tests.conftest import running_server
from tests.test_openai_proxy import running_proxy

pytestmark = pytest.mark.server
MODELS = ["omniasr_llm", "higgs_audio"]
TOKENS = 6


@pytest.fixture(scope="module")
def server(tmp_path_factory, tiny_checkpoints):
    sets = [f"{m}.pre.max_new_tokens={TOKENS}" for m in MODELS]
    with running_server(tmp_path_factory.mktemp("asr_llm_more"), MODELS, sets) as s:
        yield s


@pytest.fixture(scope="module")
def client(server):
    return TranscribeClient(server.grpc_url, timeout_s=300)


@pytest.fixture(scope="module")
def sdk(server, tmp_path_factory):
    with running_proxy(server.grpc_url, tmp_path_factory.mktemp("asr_llm_more_proxy") / "proxy.log") as url:
        yield openai.OpenAI(api_key="unused", base_url=f"{url}/v1", max_retries=0, timeout=120)


def test_omniasr_llm_transcript_equals_generate(client, tiny_checkpoints):
    from transformers import AutoProcessor, OmniASRForConditionalGeneration

    folder = str(tiny_checkpoints["omniasr_llm"])
    model, processor = OmniASRForConditionalGeneration.from_pretrained(folder).eval(), AutoProcessor.from_pretrained(folder)
    wav = espeak_wav()
    for language in ("en", None):
        inputs = processor.apply_transcription_request(audio.decode(wav, 16000)[0], language=language, return_tensors="pt")
        with torch.inference_mode():
            ids = model.generate(**inputs, max_new_tokens=TOKENS, do_sample=False)[0, inputs["input_ids"].shape[1]:]
        want = processor.decode(ids, skip_special_tokens=True).lstrip()
        result = client.transcribe("omniasr_llm", wav, language=language)
        assert result.text == want and result.language == (language or "")
    with pytest.raises(Exception, match="field 'prompt'"):
        client.transcribe("omniasr_llm", wav, prompt="context")


def test_higgs_transcribes_and_translates(client, sdk):
    wav = espeak_wav("Bonjour tout le monde.")
    said = client.transcribe("higgs_audio", wav)
    assert "".join(client.stream("higgs_audio", wav)) == said.text
    translated = client.transcribe("higgs_audio", wav, translate=True)
    assert isinstance(translated.text, str) and translated.task == "translate"
    body = sdk.audio.translations.create(model="higgs_audio", file=("fr.wav", wav, "audio/wav"))
    assert body.text == translated.text
    assert sdk.audio.transcriptions.create(model="higgs_audio", file=("fr.wav", wav, "audio/wav")).text == said.text
    with pytest.raises(openai.BadRequestError) as e:
        sdk.audio.translations.create(model="omniasr_llm", file=("fr.wav", wav, "audio/wav"))
    assert e.value.body["param"] == "model"
    with pytest.raises(Exception, match="task"):          # its ensemble has no such input
        next(iter(client.responses("omniasr_llm", wav, translate=True)))
