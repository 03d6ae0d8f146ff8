"""Speech to text: /v1/audio/transcriptions and /v1/audio/translations (OpenAI's multipart requests).

Fields: `file` (the audio), `model`, `language`, `prompt` (refused, naming the field, by a model that
takes none), `response_format` (json, text, verbose_json with segments, srt, vtt), `temperature`,
`timestamp_granularities[]` (segment, word; with verbose_json), `stream`. With `stream=true` the answer
is server-sent events as OpenAI's streaming transcription sends them: `transcript.text.delta` events
(one per response of the model: a model that does not stream, like a CTC model, answers in one piece)
and `transcript.text.done` with the whole text and its usage.

/v1/audio/translations (into English; `file`, `model`, `prompt`, `response_format`, `temperature`) goes to
a model that translates, one whose ensemble takes the `task` input (sent as "translate"); another
model answers 400 naming `model`, pointing to transcriptions.
"""
from __future__ import annotations

from contextlib import aclosing

from fastapi import APIRouter, Request
from fastapi.responses import PlainTextResponse

from triton_omni.client.openai_proxy.context import proxy_of
from triton_omni.client.openai_proxy.errors import ProxyError, bad_field
from triton_omni.client.openai_proxy.fields import Fields, form_body
from triton_omni.client.openai_proxy.sse import event, sse_response
from triton_omni.client.openai_proxy.triton import ClientGone, first_response
from triton_omni.client.tensors import text
from triton_omni.client.transcribe import FORMATS, Transcription, request_values

router = APIRouter()
MAX_LANGUAGE_CHARS = 32
MAX_PROMPT_CHARS = 4096
GRANULARITIES = ("segment", "word")
MEDIA_TYPES = {"text": "text/plain", "srt": "application/x-subrip", "vtt": "text/vtt"}


def model_field(field: str) -> str:
    """The model's field names -> the request's."""
    return {"audio": "file", "timestamp_granularities": "timestamp_granularities[]"}.get(field, field)


def granularities(form: Fields, fmt: str) -> bool:
    """Whether word timestamps are asked for (`timestamp_granularities[]`, OpenAI's repeated form field)."""
    items = [v for name in ("timestamp_granularities[]", "timestamp_granularities") for v in form.data.getlist(name)]
    for item in items:
        if item not in GRANULARITIES:
            raise bad_field("timestamp_granularities[]", f"expected segment or word, got {str(item)[:40]!r}")
    if items and fmt != "verbose_json":
        raise bad_field("timestamp_granularities[]", "needs response_format verbose_json")
    return "word" in items


async def parse(request: Request, translate: bool = False):
    form = await form_body(request)
    audio = await form.file_bytes("file", required=True)
    fmt = form.string("response_format", choices=FORMATS, default="json")
    stream = False if translate else bool(form.boolean("stream", False))
    if stream and fmt not in ("json", "text"):
        raise bad_field("stream", f"a streamed transcript is text deltas: response_format must be json or text, "
                                  f"not {fmt}")
    language = None if translate else form.string("language", max_chars=MAX_LANGUAGE_CHARS)
    values = request_values(audio, language=language, prompt=form.string("prompt", max_chars=MAX_PROMPT_CHARS),
                            temperature=form.number("temperature", lo=0, hi=1),
                            words=granularities(form, fmt), stream=stream, translate=translate)
    return form, fmt, stream, values


@router.post("/v1/audio/transcriptions")
async def transcriptions(request: Request):
    proxy = proxy_of(request)
    form, fmt, stream, values = await parse(request)
    model = await proxy.models.resolve("transcription", form.string("model"))
    replies = proxy.gateway.stream(model.name, values, request.is_disconnected, model_field)
    if stream:
        head = await first_response(replies)       # a bad request is still an HTTP error
        return sse_response(transcript_events(replies, head))
    async with aclosing(replies):
        result = Transcription.from_responses([o async for o in replies])
    body = result.render(fmt, words=values["timestamp_granularities"][0] is not None)
    return PlainTextResponse(body, media_type=MEDIA_TYPES[fmt]) if isinstance(body, str) else body


async def transcript_events(replies, head):
    seen = [head]
    async with aclosing(replies):
        try:
            piece = text(head, "text")
            if piece:
                yield event({"type": "transcript.text.delta", "delta": piece})
            async for outputs in replies:
                seen.append(outputs)
                piece = text(outputs, "text")
                if piece:
                    yield event({"type": "transcript.text.delta", "delta": piece})
        except ProxyError as e:
            yield event(e.body())
            return
        except ClientGone:
            return
    result = Transcription.from_responses(seen)
    yield event({"type": "transcript.text.done", "text": result.text, "usage": result.usage()})


@router.post("/v1/audio/translations")
async def translations(request: Request):
    proxy = proxy_of(request)
    form, fmt, _, values = await parse(request, translate=True)
    model = await proxy.models.resolve("transcription", form.string("model"))
    if "task" not in model.inputs:
        raise ProxyError(400, f"'model': {model.name} does not translate: it transcribes speech in the language "
                              "spoken (POST /v1/audio/transcriptions)", param="model", code="unsupported")
    replies = proxy.gateway.stream(model.name, values, request.is_disconnected, model_field)
    async with aclosing(replies):
        result = Transcription.from_responses([o async for o in replies])
    result.task, result.language = "translate", "english"
    body = result.render(fmt, words=values["timestamp_granularities"][0] is not None)
    return PlainTextResponse(body, media_type=MEDIA_TYPES[fmt]) if isinstance(body, str) else body
