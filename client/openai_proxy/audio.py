"""Audio routes: /v1/audio/speech, /v1/audio/voices (transcriptions: transcriptions.py).

Speech streams live as raw PCM (s16le mono): the model sends PCM chunks as it speaks. With
`response_format: pcm` they are relayed as they come, as raw bytes or, with `stream_format: sse`,
as `speech.audio.delta` events (base64) closed by `speech.audio.done`. Other formats are files
the model encodes whole, so they arrive in one piece (as bytes, or as deltas of that file).
`x-audio-sample-rate` and `x-audio-channels` headers say how to play the audio.
"""
from __future__ import annotations

import base64
from contextlib import aclosing

from fastapi import APIRouter, Request
from fastapi.responses import Response, StreamingResponse

from triton_omni.client.openai_proxy.context import proxy_of
from triton_omni.client.openai_proxy.errors import ProxyError, bad_field, missing
from triton_omni.client.openai_proxy.fields import INT64_MAX, INT64_MIN, Fields, form_body, json_body, shown
from triton_omni.client.openai_proxy.sse import event, sse_response
from triton_omni.client.openai_proxy.triton import ClientGone, first_response
from triton_omni.client.tensors import first

router = APIRouter()
MEDIA_TYPES = {"mp3": "audio/mpeg", "opus": "audio/ogg", "wav": "audio/wav", "flac": "audio/flac", "pcm": "audio/pcm"}
SSE_DELTA_BYTES = 32 << 10      # a whole file sent as SSE is cut in deltas of this size
MAX_INPUT_CHARS = 4096          # OpenAI's limit on `input`
MAX_VOICE_NAME_CHARS = 256


def speech_sampling(body: Fields) -> dict | None:
    """Extensions that reach the model's sampler (OpenAI's speech API has none)."""
    p = {"seed": body.number("seed", lo=INT64_MIN, hi=INT64_MAX, integer=True),
         "temperature": body.number("temperature", lo=0, hi=2),
         "top_p": body.number("top_p", lo=0, hi=1, lo_open=True), "top_k": body.number("top_k", lo=-1, integer=True),
         "max_tokens": body.number("max_tokens", lo=1, integer=True)}
    p = {k: v for k, v in p.items() if v is not None}
    return p or None


def resolve_voice(proxy, body: Fields) -> dict:
    """`voice`: an uploaded voice (name or id; or {"id": ...}) -> reference audio + text; else a
    built-in voice name the model knows."""
    raw = body.raw("voice")
    if raw is None:
        return {}
    key = raw.get("id") if isinstance(raw, dict) else raw
    if not isinstance(key, str) or not key:
        raise bad_field("voice", "expected a voice name or an object {'id': ...}")
    uploaded = proxy.voices.find(key)
    if uploaded is not None:
        return {"reference_audio": (uploaded.audio, "BYTES"),
                "reference_text": (uploaded.transcript or None, "BYTES")}
    if isinstance(raw, dict):
        raise bad_field("voice", f"no uploaded voice with id {shown(key)} (POST /v1/audio/voices uploads one)")
    return {"voice": (key, "BYTES")}


def speech_param(field: str) -> str:
    """The model's field names -> the request's (text -> input, sampling_parameters.seed -> seed)."""
    if field == "text":
        return "input"
    return field.split(".", 1)[1] if field.startswith("sampling_parameters.") else field


@router.post("/v1/audio/speech")
async def speech(request: Request):
    proxy = proxy_of(request)
    body = await json_body(request)
    model_name = body.string("model")
    text_in = body.string("input", required=True, max_chars=MAX_INPUT_CHARS)
    if not text_in.strip():
        raise bad_field("input", "is empty")
    fmt = body.string("response_format", choices=tuple(MEDIA_TYPES), default="mp3")
    stream_format = body.string("stream_format", choices=("audio", "sse"), default="audio")
    speed = body.number("speed", lo=0.25, hi=4.0)
    voice = resolve_voice(proxy, body)
    sampling = speech_sampling(body)
    model = await proxy.models.resolve("speech", model_name)

    live = fmt == "pcm"           # the model streams PCM only; files come whole
    values = {"text": (text_in, "BYTES"), "response_format": (fmt, "BYTES"), "stream": (live, "BOOL"),
              "speed": (speed, "FP32"), "sampling_parameters": (sampling, "BYTES"), **voice,
              # how to speak (OpenAI's field), and the text's language (an extension); a model without
              # them refuses them, naming the field
              "instructions": (body.string("instructions"), "BYTES"), "language": (body.string("language"), "BYTES")}
    replies = proxy.gateway.stream(model.name, values, request.is_disconnected, speech_param)
    head = await first_response(replies)
    rate = int(first(head, "sample_rate", 0))
    headers = {"x-audio-sample-rate": str(rate), "x-audio-channels": "1"}
    if stream_format == "sse":
        return sse_response(speech_events(replies, head), headers)
    if not live:      # one file (a model may still send it in pieces)
        async with aclosing(replies):
            audio = first(head, "audio", b"") + b"".join([first(o, "audio", b"") async for o in replies])
        return Response(audio, media_type=MEDIA_TYPES[fmt], headers=headers)
    return StreamingResponse(pcm_bytes(replies, head), media_type=MEDIA_TYPES[fmt], headers=headers)


async def _relay(replies, head):
    yield head
    async for outputs in replies:
        yield outputs


async def pcm_bytes(replies, head):
    async with aclosing(replies):
        try:
            async for outputs in _relay(replies, head):
                chunk = first(outputs, "audio", b"")
                if chunk:
                    yield chunk
        except (ProxyError, ClientGone):
            return      # raw bytes have no way to carry an error: the stream just ends


async def speech_events(replies, head):
    """speech.audio.delta events (base64 audio), then speech.audio.done with usage."""
    last = head
    async with aclosing(replies):
        try:
            async for outputs in _relay(replies, head):
                last = outputs
                audio = first(outputs, "audio", b"")
                for i in range(0, len(audio), SSE_DELTA_BYTES):
                    yield event({"type": "speech.audio.delta",
                                 "audio": base64.b64encode(audio[i:i + SSE_DELTA_BYTES]).decode()})
        except ProxyError as e:
            yield event(e.body())
            return
        except ClientGone:
            return
    # Speech models report no token counts today; counts are passed on when a model sends them.
    prompt, completion = int(first(last, "prompt_tokens", 0)), int(first(last, "completion_tokens", 0))
    yield event({"type": "speech.audio.done",
                 "usage": {"input_tokens": prompt, "output_tokens": completion, "total_tokens": prompt + completion}})


# -- uploaded voices ----------------------------------------------------------------------------
@router.post("/v1/audio/voices")
async def create_voice(request: Request):
    proxy = proxy_of(request)
    form = await form_body(request)
    name = form.string("name", required=True, max_chars=MAX_VOICE_NAME_CHARS).strip()
    if not name:
        raise bad_field("name", "is empty")
    found = form.files("audio_sample", "audio", "file")
    if not found:
        raise missing("audio_sample")
    audio = await found[0][1].read()
    if not audio:
        raise bad_field(found[0][0], "the uploaded file is empty")
    transcript = (form.string("transcript") or form.string("reference_text") or form.string("text") or "").strip()
    try:
        voice = proxy.voices.add(name, audio, transcript, found[0][1].filename or "")
    except KeyError:
        raise ProxyError(409, f"a voice named {name!r} exists; delete it first (DELETE /v1/audio/voices/{{id}})",
                         param="name", code="voice_exists") from None
    return voice.public()


@router.get("/v1/audio/voices")
async def list_voices(request: Request):
    return {"object": "list", "data": [v.public() for v in proxy_of(request).voices.all()]}


def _voice_or_404(request: Request, voice_id: str):
    voice = proxy_of(request).voices.find(voice_id)
    if voice is None:
        raise ProxyError(404, f"no voice {shown(voice_id)}", param="voice_id", code="voice_not_found")
    return voice


@router.get("/v1/audio/voices/{voice_id}")
async def get_voice(request: Request, voice_id: str):
    return _voice_or_404(request, voice_id).public()


@router.delete("/v1/audio/voices/{voice_id}")
async def delete_voice(request: Request, voice_id: str):
    voice = _voice_or_404(request, voice_id)
    proxy_of(request).voices.delete(voice.id)
    return {"id": voice.id, "object": "audio.voice.deleted", "deleted": True}

