"""WebSocket /v1/realtime?model=NAME: OpenAI's realtime API, turn based, over a cascade of served models.

The client appends PCM16 audio to the input audio buffer and commits it (a user audio item, transcribed
by the session's transcription model: conversation.item.input_audio_transcription.completed), or
creates items (user text, user audio, system or assistant messages); response.create answers the
conversation with the chat model, its text spoken sentence by sentence by the speech model
(realtime_cascade.py). One response at a time; response.cancel, or the socket closing, cancels it and
its Triton streams. Every refused event gets an `error` event naming the field (the client's
`event_id` in it) and the session goes on. There is no voice activity detection: `turn_detection`
is null, the client commits its turns.

The key is the proxy's (guards.py): `Authorization: Bearer KEY`, or a browser's subprotocol
`openai-insecure-api-key.KEY` (as OpenAI takes it); a refused key gets the HTTP 401 (429 past the rate
limit) before the socket opens.
"""
from __future__ import annotations

import asyncio
import dataclasses
import json
import logging

from fastapi import APIRouter, WebSocket
from fastapi.responses import JSONResponse

from triton_omni.client.openai_proxy.errors import ProxyError
from triton_omni.client.openai_proxy.guards import admit
from triton_omni.client.openai_proxy.realtime_cascade import Answer, run_cascade, transcribe
from triton_omni.client.openai_proxy.realtime_session import (
    MAX_INSTRUCTIONS_CHARS, MAX_NAME_CHARS, AudioBuffer, Conversation, EventError, Item, SessionConfig,
    check_max_tokens, check_modalities, check_temperature, check_text, decode_pcm, new_id, wav_of)

router = APIRouter()
log = logging.getLogger("openai_proxy")
KEY_SUBPROTOCOL = "openai-insecure-api-key."
MAX_ITEM_ID_CHARS = 64
ROLES = {"user": ("input_text", "input_audio"), "system": ("input_text",), "assistant": ("text", "output_text",
                                                                                         "audio")}
RESPONSE_FIELDS = ("modalities", "output_modalities", "instructions", "voice", "temperature", "max_output_tokens",
                   "max_response_output_tokens", "conversation", "metadata", "tools", "tool_choice")
SESSION_FIELD = {"chat": "session.model", "transcription": "session.input_audio_transcription.model",
                 "speech": "session.speech_model"}


def _authorization(ws: WebSocket) -> str:
    given = ws.headers.get("authorization", "")
    if given:
        return given
    for proto in ws.scope.get("subprotocols", []):
        if proto.startswith(KEY_SUBPROTOCOL):
            return f"Bearer {proto[len(KEY_SUBPROTOCOL):]}"
    return ""


@router.websocket("/v1/realtime")
async def realtime(ws: WebSocket):
    proxy = ws.app.state.proxy
    refused = admit(proxy, _authorization(ws), ws.client.host if ws.client else None)
    limit = proxy.settings.realtime_max_sessions
    if refused is None and proxy.realtime_sessions >= limit:
        refused = ProxyError(429, f"{limit} realtime sessions are open, the most this proxy keeps at once (its "
                                  "--realtime-max-sessions); retry later", code="too_many_sessions",
                             headers={"Retry-After": "1"})
    if refused is not None:
        if "websocket.http.response" in ws.scope.get("extensions", {}):    # the HTTP answer, in OpenAI's shape
            await ws.send_denial_response(JSONResponse(refused.body(), refused.status, refused.headers))
        else:
            await ws.close(code=1008, reason=refused.message[:120])
        return
    offered = ws.scope.get("subprotocols", [])
    proxy.realtime_sessions += 1
    try:
        await ws.accept(subprotocol="realtime" if "realtime" in offered else None)
        await Session(proxy, ws, ws.query_params.get("model")).run()
    finally:
        proxy.realtime_sessions -= 1


def _error_event(e: EventError | ProxyError, event_id) -> dict:
    return {"type": "error", "error": {"type": e.type, "code": e.code, "message": e.message, "param": e.param,
                                       "event_id": event_id if isinstance(event_id, str) else None}}


class Session:
    def __init__(self, proxy, ws: WebSocket, model: str | None):
        s = proxy.settings
        self.proxy, self.ws, self.gateway = proxy, ws, proxy.gateway
        self.config = SessionConfig(model=model or s.realtime_chat_model,
                                    transcription_model=s.realtime_transcription_model,
                                    speech_model=s.realtime_speech_model, voice=s.realtime_voice)
        self.buffer = AudioBuffer(s.realtime_max_buffer_bytes)
        self.conversation = Conversation(s.max_text_chars)
        self.response: asyncio.Task | None = None
        self.transcriptions: set[asyncio.Task] = set()
        self.lock = asyncio.Lock()
        self.open = True

    async def send(self, event: dict) -> None:
        if not self.open:
            return
        async with self.lock:
            try:
                # ASCII JSON: a lone surrogate a client sent (escaped) and gets echoed cannot fail the encoding
                await self.ws.send_text(json.dumps({"event_id": new_id("event"), **event}))
            except Exception:  # noqa: BLE001 - the client is gone: the receive loop ends the session
                self.open = False

    # -- the models -------------------------------------------------------------------------------------------
    async def model(self, route: str, config: SessionConfig | None = None):
        """The served model of `route` the session uses (ProxyError naming the session field if none)."""
        c = config or self.config
        name = {"chat": c.model, "transcription": c.transcription_model, "speech": c.speech_model}[route]
        try:
            return await self.proxy.models.resolve(route, name)
        except ProxyError as e:
            e.param = SESSION_FIELD[route]
            raise

    async def public(self) -> dict:
        resolved = {}
        for route in SESSION_FIELD:
            try:
                resolved[route] = (await self.model(route)).name
            except ProxyError:
                resolved[route] = None
        return self.config.public(resolved)

    # -- the event loop ---------------------------------------------------------------------------------------
    async def run(self) -> None:
        await self.send({"type": "session.created", "session": await self.public()})
        try:
            while self.open:
                message = await self.ws.receive()
                if message["type"] == "websocket.disconnect":
                    break
                if message.get("text") is None:
                    await self.send(_error_event(EventError("expected a text frame holding a JSON event, got a "
                                                            "binary frame", None, "invalid_event"), None))
                    continue
                await self.handle(message["text"])
        finally:
            self.open = False
            running = [t for t in (self.response, *self.transcriptions) if t is not None]
            for t in running:       # closes their Triton streams with cancel_requests=True
                t.cancel()
            await asyncio.gather(*running, return_exceptions=True)

    async def handle(self, raw: str) -> None:
        event_id = None
        try:
            try:
                event = json.loads(raw)
            except ValueError as e:
                raise EventError(f"the event is not valid JSON: {e}", None, "invalid_json") from None
            if not isinstance(event, dict):
                raise EventError("expected a JSON object with a 'type'", None, "invalid_event")
            event_id = event.get("event_id")
            kind = event.get("type")
            handler = HANDLERS.get(kind) if isinstance(kind, str) else None
            if handler is None:
                shown = repr(kind)[:80]
                raise EventError(f"unknown event type {shown}; supported: {', '.join(HANDLERS)}", "type",
                                 "unknown_event_type")
            await handler(self, event)
        except (EventError, ProxyError) as e:
            await self.send(_error_event(e, event_id))
        except Exception:  # noqa: BLE001 - a bug: logged, the client told, the session goes on
            log.exception("realtime event failed")
            await self.send(_error_event(EventError("internal error (the server's log has the detail)", None,
                                                    "internal_error", "server_error"), event_id))

    # -- client events ----------------------------------------------------------------------------------------
    async def session_update(self, event: dict) -> None:
        config = dataclasses.replace(self.config)
        config.update(event.get("session"), buffered=bool(self.buffer.pcm))
        for route, field in (("chat", "model"), ("transcription", "transcription_model"),
                             ("speech", "speech_model")):
            if getattr(config, field) != getattr(self.config, field) and getattr(config, field) is not None:
                await self.model(route, config)      # a model that is not served is refused now
        self.config = config
        await self.send({"type": "session.updated", "session": await self.public()})

    async def buffer_append(self, event: dict) -> None:
        self.buffer.append(decode_pcm(event.get("audio"), "audio"))

    async def buffer_commit(self, event: dict) -> None:
        model = (await self.model("transcription")).name     # before the audio is taken: refused, it stays
        pcm = self.buffer.take(self.config.input_rate)
        item = Item(new_id("item"), "user", "input_audio")
        previous = self.conversation.add(item)
        await self.send({"type": "input_audio_buffer.committed", "previous_item_id": previous, "item_id": item.id})
        await self.send({"type": "conversation.item.created", "previous_item_id": previous, "item": item.public()})
        self.start_transcription(item, model, pcm)

    async def buffer_clear(self, event: dict) -> None:
        self.buffer.pcm.clear()
        await self.send({"type": "input_audio_buffer.cleared"})

    async def item_create(self, event: dict) -> None:
        raw = event.get("item")
        if not isinstance(raw, dict):
            raise EventError("'item': expected an object {type: message, role, content}", "item")
        if raw.get("type", "message") != "message":
            raise EventError(f"'item.type': only message items are supported, got {str(raw.get('type'))[:40]!r}",
                             "item.type", "unsupported")
        role = raw.get("role")
        if role not in ROLES:
            raise EventError(f"'item.role': expected user, assistant or system, got {str(role)[:40]!r}", "item.role")
        content = raw.get("content")
        if not isinstance(content, list) or not content:
            raise EventError("'item.content': expected a non-empty list of content parts", "item.content")
        texts, pcm, kind = [], None, ROLES[role][0]
        for i, part in enumerate(content):
            where = f"item.content[{i}]"
            ptype = part.get("type") if isinstance(part, dict) else None
            if ptype not in ROLES[role]:
                raise EventError(f"'{where}.type': a {role} message takes {', '.join(ROLES[role])} parts",
                                 f"{where}.type")
            if ptype == "input_audio" and part.get("transcript") is None:
                if pcm is not None:
                    raise EventError(f"'{where}': one input_audio part per item", where)
                pcm, kind = decode_pcm(part.get("audio"), f"{where}.audio"), "input_audio"
                continue
            key = "transcript" if ptype in ("input_audio", "audio") else "text"
            texts.append(check_text(part.get(key), f"{where}.{key}"))
            kind = "input_audio" if ptype == "input_audio" else ("audio" if ptype == "audio" else kind)
        item_id = raw.get("id") or new_id("item")
        if not isinstance(item_id, str) or len(item_id) > MAX_ITEM_ID_CHARS:
            raise EventError(f"'item.id': expected a string of at most {MAX_ITEM_ID_CHARS} characters", "item.id")
        model = (await self.model("transcription")).name if pcm is not None else None
        if pcm is not None and len(pcm) / 2 / self.config.input_rate < 0.1:
            raise EventError(f"'item.content': the audio is shorter than 100 ms", "item.content",
                             "input_audio_buffer_commit_empty")
        item = Item(item_id, role, kind, None if pcm is not None else "".join(texts))
        previous_id = event.get("previous_item_id")
        if previous_id is not None and not isinstance(previous_id, str):
            raise EventError("'previous_item_id': expected an item id or \"root\"", "previous_item_id")
        previous = self.conversation.add(item, previous_id)
        await self.send({"type": "conversation.item.created", "previous_item_id": previous, "item": item.public()})
        if pcm is not None:
            self.start_transcription(item, model, pcm)

    async def response_create(self, event: dict) -> None:
        if self.response is not None:
            raise EventError("the conversation already has an active response; cancel it (response.cancel) or wait "
                             "for its response.done", None, "conversation_already_has_active_response")
        opts = event.get("response") or {}
        if not isinstance(opts, dict):
            raise EventError("'response': expected an object", "response")
        for key in opts:
            if key not in RESPONSE_FIELDS:
                raise EventError(f"'response.{key}': unknown or unsupported response field", f"response.{key}",
                                 "unknown_parameter")
        c = self.config
        modalities = c.modalities
        for key in ("modalities", "output_modalities"):
            if opts.get(key) is not None:
                modalities = check_modalities(opts[key], f"response.{key}")
        temperature = check_temperature(opts.get("temperature"), "response.temperature")
        limit = next((k for k in ("max_output_tokens", "max_response_output_tokens") if k in opts), None)
        max_tokens = check_max_tokens(opts[limit], f"response.{limit}") if limit else c.max_output_tokens
        instructions = check_text(opts.get("instructions", c.instructions), "response.instructions",
                                  MAX_INSTRUCTIONS_CHARS)
        voice = opts.get("voice", c.voice)
        if voice is not None:
            voice = check_text(voice, "response.voice", MAX_NAME_CHARS)
        conversation = opts.get("conversation", "auto")
        if conversation not in ("auto", "none"):
            raise EventError("'response.conversation': expected \"auto\" or \"none\"", "response.conversation")
        if opts.get("tools") not in (None, []) or opts.get("tool_choice") not in (None, "auto", "none"):
            raise EventError("'response.tools': not supported by this server", "response.tools", "unsupported")
        if not self.conversation.has_user_input():
            raise EventError("nothing to answer: the conversation has no user message (commit input audio or "
                             "create a user item first)", None, "conversation_empty")
        chat = await self.model("chat")
        speech = (await self.model("speech")).name if "audio" in modalities else None
        sampling = {k: v for k, v in (("temperature", temperature if temperature is not None else c.temperature),
                                      ("max_tokens", max_tokens)) if v is not None}
        meta = {"id": new_id("resp"), "object": "realtime.response", "status": "in_progress", "status_details": None,
                "output": [], "conversation_id": "conv_default" if conversation == "auto" else None,
                "modalities": list(modalities), "voice": voice if speech else None, "output_audio_format": "pcm16",
                "temperature": sampling.get("temperature"), "max_output_tokens": max_tokens or "inf",
                "metadata": opts.get("metadata"), "usage": None}
        self.response = asyncio.create_task(self.respond(meta, chat, speech, voice, instructions, sampling,
                                                         conversation == "auto"))
        self.response.response_id = meta["id"]
        self.response.add_done_callback(self.response_ended)

    def response_ended(self, task: asyncio.Task) -> None:
        if self.response is task:
            self.response = None

    async def response_cancel(self, event: dict) -> None:
        wanted = event.get("response_id")
        if self.response is None:
            raise EventError("no response is in progress", None, "response_cancel_not_active")
        if wanted is not None and wanted != self.response_id:
            raise EventError(f"'response_id': the response in progress is {self.response_id}", "response_id",
                             "response_cancel_not_active")
        await asyncio.sleep(0)      # a response created in the same breath starts first, so it always ends
        if self.response is not None:     # with its response.done
            self.response.cancel()

    # -- work in the background ------------------------------------------------------------------------------
    def start_transcription(self, item: Item, model: str, pcm: bytes) -> None:
        task = asyncio.create_task(self.transcribe(item, model, pcm, self.config.input_rate))
        item.transcribed = task
        self.transcriptions.add(task)
        task.add_done_callback(self.transcriptions.discard)

    async def transcribe(self, item: Item, model: str, pcm: bytes, rate: int) -> None:
        try:
            result = await transcribe(self.gateway, model, wav_of(pcm, rate), self.config.language)
        except ProxyError as e:
            if e.param in ("language", "file"):      # the model's field, as the session names it
                e.param = {"language": "session.input_audio_transcription.language", "file": "audio"}[e.param]
            item.text = ""
            await self.send({"type": "conversation.item.input_audio_transcription.failed", "item_id": item.id,
                             "content_index": 0, "error": _error_event(e, None)["error"]})
            return
        item.text = result.text.strip()
        await self.send({"type": "conversation.item.input_audio_transcription.completed", "item_id": item.id,
                         "content_index": 0, "transcript": item.text, "usage": result.usage()})

    @property
    def response_id(self) -> str | None:
        return getattr(self.response, "response_id", None)

    async def respond(self, meta: dict, chat, speech: str | None, voice: str | None, instructions: str,
                      sampling: dict, in_conversation: bool) -> None:
        rid = meta["id"]
        item = Item(new_id("item"), "assistant", "audio" if speech else "text", "", "in_progress")
        ids = {"response_id": rid, "item_id": item.id, "output_index": 0, "content_index": 0}
        answer, status, details, started = Answer(), "completed", None, False
        try:
            await self.send({"type": "response.created", "response": meta})
            messages = await self.conversation.messages(instructions)
            previous = self.conversation.add(item) if in_conversation else None
            await self.send({"type": "response.output_item.added", "response_id": rid, "output_index": 0,
                             "item": item.public()})
            if in_conversation:
                await self.send({"type": "conversation.item.created", "previous_item_id": previous,
                                 "item": item.public()})
            started = True
            await self.send({"type": "response.content_part.added", **ids, "part": self.part(item, "")})
            delta = "response.audio_transcript.delta" if speech else "response.text.delta"

            async def send_text(piece: str):
                await self.send({"type": delta, **ids, "delta": piece})

            async def send_audio(b64: str):
                await self.send({"type": "response.audio.delta", **ids, "delta": b64})
            await run_cascade(self.gateway, chat, speech, voice, self.config.output_rate, messages, sampling,
                              answer, send_text, send_audio)
            if answer.finish_reason == "length":
                status, details = "incomplete", {"type": "incomplete", "reason": "max_output_tokens"}
        except asyncio.CancelledError:
            status, details = "cancelled", {"type": "cancelled", "reason": "client_cancelled"}
        except (ProxyError, EventError) as e:
            status, details = "failed", {"type": "failed", "error": _error_event(e, None)["error"]}
        except Exception:  # noqa: BLE001 - a bug: logged, the response fails, the session goes on
            log.exception("realtime response failed")
            status, details = "failed", {"type": "failed", "error": {"type": "server_error", "code": "internal_error",
                                                                     "message": "internal error", "param": None}}
        finally:
            self.response = None
        item.text, item.status = answer.text, "completed" if status == "completed" else "incomplete"
        if started:
            if speech:
                await self.send({"type": "response.audio.done", **ids})
                await self.send({"type": "response.audio_transcript.done", **ids, "transcript": item.text})
            else:
                await self.send({"type": "response.text.done", **ids, "text": item.text})
            await self.send({"type": "response.content_part.done", **ids, "part": self.part(item, item.text)})
            await self.send({"type": "response.output_item.done", "response_id": rid, "output_index": 0,
                             "item": item.public()})
        u = answer.usage
        usage = {"total_tokens": u["prompt_tokens"] + u["completion_tokens"], "input_tokens": u["prompt_tokens"],
                 "output_tokens": u["completion_tokens"],
                 "input_token_details": {"cached_tokens": u["cached_tokens"], "text_tokens": u["prompt_tokens"],
                                         "audio_tokens": 0},
                 "output_token_details": {"text_tokens": u["completion_tokens"], "audio_tokens": 0}}
        await self.send({"type": "response.done", "response": {
            **meta, "status": status, "status_details": details, "output": [item.public()] if started else [],
            "usage": usage}})

    @staticmethod
    def part(item: Item, text: str) -> dict:
        return {"type": "audio", "transcript": text} if item.kind == "audio" else {"type": "text", "text": text}


HANDLERS = {"session.update": Session.session_update, "input_audio_buffer.append": Session.buffer_append,
            "input_audio_buffer.commit": Session.buffer_commit, "input_audio_buffer.clear": Session.buffer_clear,
            "conversation.item.create": Session.item_create, "response.create": Session.response_create,
            "response.cancel": Session.response_cancel}
