"""The decoupled AR step: token ids in, token ids streamed out, decoded by the engine in-process.

Three threads: Triton's, which only validates and queues (`submit`); the engine loop, which runs
the model step after step; and a delivery thread, which turns engine outputs into responses (UTF-8
and stop-string hold-back, stop strings, cancellation checks), so that sending responses never
slows the model down.
"""
from __future__ import annotations

import collections
import copy
import dataclasses
import json
import queue
import sys
import threading
import traceback
import time
from dataclasses import dataclass, field

import numpy as np
import torch

from triton_omni.ar.config import EngineConfig
from triton_omni.ar.engine import EngineThread, LLMEngine
from triton_omni.ar.request_metrics import ARRequestMetrics
from triton_omni.ar.sampling import SamplingParams
from triton_omni.ar.sequence import Sequence
from triton_omni.models.registry import load_causal_lm, text_config
from triton_omni.runtime.errors import Cancelled, InvalidInput
from triton_omni.runtime.front import ABORT_INPUT
from triton_omni.runtime import metrics, warmup
from triton_omni.runtime.metrics import Gauge
from triton_omni.runtime.params import torch_dtype
from triton_omni.runtime.spec import TensorSpec
from triton_omni.runtime.step import Request, ResponseSink, Step, StepContext, register, string_array
from triton_omni.text.channels import CONTENT, ChannelSplitter, MarkerIds, opens_reasoning
from triton_omni.text.replies import ReplyOptions
from triton_omni.text.stream import TokenStream
from triton_omni.text.tokenizer import load_tokenizer, token_byte_table

CONTEXT_TOKENS = 4          # already-sent tokens repeated in each response for the detokenizer
CANCEL_CHECK_S = 0.1
ABORT_MEMORY_S = 60.0
CANCEL = "cancel"            # outbox message: the front asked to abort this reply
CANCEL_CHECKS_PER_ROUND = 8
STREAMS_PER_TOKEN = 2        # stream_interval 0 (auto): one more token per response for every 2 live streams


@dataclass
class ARParams(EngineConfig):
    """The engine's settings (EngineConfig: each field's default and meaning there), and the step's own."""
    checkpoint: str = ""
    dtype: str = "float32"
    load_format: str = "auto"          # "dummy": random weights from config.json (benchmarks)
    # FP8 (E4M3) weights for every linear layer of the decoder, quantized at load (models/quant.py):
    # "none" (weights in `dtype`), "fp8" (a scale per output channel), "fp8_block" (per 128 x 128 block).
    # An FP8 checkpoint (transformers' fine-grained layout) keeps its own blocks under either; under
    # "none" it is dequantized. `quantize_lm_head`: the lm_head too (released FP8 checkpoints keep it in 16 bits).
    quantization: str = "none"
    quantize_lm_head: bool = False
    # tokens per streamed response after the first (which goes out at once, for the time to first
    # token): n >= 1 at least n (fewer only at the end); 0 (auto): 1 while one stream is live, then
    # one more per STREAMS_PER_TOKEN live streams (33 at 64). Each response is a request for every
    # later ensemble step and a relay through the model's front, so under load their number, not the
    # tokens, bounds the server. H200, qwen3_chat, qwen3-0.6b shape, c=64 (in-process: 22.1-22.4k
    # tokens/s): 9 a response (auto's old rule, one more per 8 streams) 10.5-13.2k, 32 19.0-19.2k.
    # The chat YAMLs use auto on GPUs; the default stays 1 (a talker's frames go to its codec, not
    # to a front).
    stream_interval: int = 1
    # Python's GIL hand-over interval in this step's process (sys.setswitchinterval). The engine thread
    # gives the GIL up at every step's device->host copy; while the delivery thread is busy sending
    # responses it can then wait up to this long to get it back (Python's default: 5000 us). A profile
    # of the server at 64 streams showed the engine thread busy only two thirds of the time and decode
    # steps ~5x slower than in-process; what this setting changes there is not measured yet. 0: leave it.
    gil_switch_interval_us: int = 500

    def engine_config(self) -> EngineConfig:
        """The engine's part alone (lists copied: the engine never shares them with the step)."""
        return EngineConfig(**{f.name: copy.copy(getattr(self, f.name)) for f in dataclasses.fields(EngineConfig)})


@dataclass(eq=False)
class Group:
    """The samples of one request (n > 1): one sink, whose final response is the last sample's."""
    left: int = 1


@dataclass(eq=False)
class Reply:
    """A request's (with n > 1: one sample's) delivery state (touched only by the delivery thread after submit)."""
    sink: ResponseSink
    tokens: TokenStream
    streaming: bool
    prompt_len: int
    seq: Sequence | None = None
    context: list[int] = field(default_factory=list)
    unsent: list = field(default_factory=list)      # released, not sent yet (non-streaming: until the end)
    n_released: int = 0
    n_responses: int = 0
    done: bool = False
    request_id: str = ""
    last_checked: float = 0.0        # when Triton was last asked whether it was cancelled
    first_token_at: float = 0.0      # when its first token reached the delivery thread (wall clock)
    index: int = 0                   # which sample of its request
    group: Group = field(default_factory=Group)
    splitter: ChannelSplitter | None = None      # a chat answer's reasoning / tool-call channels
    logprobs: collections.deque | None = None    # per generated token not yet released, when asked
    echo: list[int] = field(default_factory=list)   # prompt ids to put before the first response's tokens
    cached_tokens: int = 0


def eos_token_ids(folder, tokenizer) -> list[int]:
    ids: set[int] = set()
    config, _ = text_config(folder)
    for source in (getattr(config, "eos_token_id", None), tokenizer.eos_token_id):
        ids.update(source if isinstance(source, list) else [source] if source is not None else [])
    gen = folder / "generation_config.json"
    if gen.exists():
        eos = json.loads(gen.read_text()).get("eos_token_id")
        ids.update(eos if isinstance(eos, list) else [eos] if eos is not None else [])
    return sorted(ids)


def enable_kernels(device, wanted: bool) -> None:
    """The kernels/ Triton kernels for this process's hot ops (CUDA only; the CPU keeps torch's)."""
    if torch.device(device).type == "cuda" and wanted:
        from triton_omni.kernels import dispatch

        dispatch.enable(True)


def grammar_compiler(tokenizer, vocab: int, stop_ids):
    """Structured output's compiler for this vocabulary, or None without xgrammar (requests refused)."""
    try:
        from triton_omni.ar.grammar import GrammarCompiler

        return GrammarCompiler(token_byte_table(tokenizer), vocab, list(stop_ids))
    except ImportError:
        return None


def build_engine(folder, params: ARParams, device: str, prompt_embeds: bool = False) -> tuple[LLMEngine, object]:
    """Load checkpoint + tokenizer and build the engine (also used in-process by benchmarks).
    `prompt_embeds`: an engine whose prompts may carry spliced embeddings (ar/prompt_embeds.py)."""
    dtype = torch_dtype(params.dtype)
    if params.load_format not in ("auto", "dummy"):
        raise ValueError(f"load_format must be 'auto' or 'dummy', got {params.load_format!r}")
    tokenizer = load_tokenizer(folder)
    model = load_causal_lm(folder, device, dtype, dummy=params.load_format == "dummy",
                           quantization=params.quantization, lm_head=params.quantize_lm_head)
    enable_kernels(device, params.use_triton_kernels)
    vocab = model.config.vocab_size
    eos = eos_token_ids(folder, tokenizer)
    engine = LLMEngine(model, params.engine_config(), device, dtype, eos, vocab,
                       think_ids=MarkerIds.of(tokenizer).reasoning, grammar=grammar_compiler(tokenizer, vocab, eos),
                       prompt_embeds=prompt_embeds)
    if engine.runner.use_graphs:
        engine.runner.capture_graphs()
    return engine, tokenizer


@register("ar_decode")
class ARDecode(Step):
    decoupled = True
    inputs = (
        TensorSpec("input_ids", "TYPE_INT32", (-1,), optional=True),
        TensorSpec("sampling", "TYPE_STRING", (1,), optional=True),
        TensorSpec("stream", "TYPE_BOOL", (1,), optional=True),
        TensorSpec("reply_options", "TYPE_STRING", (1,), optional=True),     # text/replies.py
        TensorSpec(ABORT_INPUT, "TYPE_STRING", (1,), optional=True, control=True),
    )
    outputs = (
        TensorSpec("token_ids", "TYPE_INT32", (-1,)),
        TensorSpec("num_context", "TYPE_INT32", (1,)),
        TensorSpec("stop_text", "TYPE_STRING", (1,)),
        TensorSpec("finish_reason", "TYPE_STRING", (1,)),
        TensorSpec("prompt_tokens", "TYPE_INT32", (1,)),
        TensorSpec("completion_tokens", "TYPE_INT32", (1,)),
        TensorSpec("token_channels", "TYPE_INT32", (-1,)),       # per token_ids entry: text/channels.py
        TensorSpec("index", "TYPE_INT32", (1,)),                 # which sample (n > 1)
        TensorSpec("cached_tokens", "TYPE_INT32", (1,)),         # prompt tokens found in the prefix cache
        TensorSpec("reasoning_tokens", "TYPE_INT32", (1,)),
        TensorSpec("token_logprobs", "TYPE_STRING", (1,)),       # JSON, per new token: [id, logprob, [[id, logprob]...]]
    )
    Params = ARParams

    def __init__(self, ctx: StepContext):
        super().__init__(ctx)
        if self.params.gil_switch_interval_us > 0:
            sys.setswitchinterval(self.params.gil_switch_interval_us / 1e6)
        self.engine = self.make_engine(ctx.checkpoint(self.params.checkpoint))
        self.outbox: queue.SimpleQueue = queue.SimpleQueue()
        self.live: set[Reply] = set()
        self.live_lock = threading.Lock()
        self.aborted: dict[str, float] = {}      # request id -> when its abort arrived early
        self.metrics = {k: Gauge(f"triton_omni_ar_{k}", d, ctx.model_name) for k, d in (
            ("decode_steps", "decode steps run"), ("decode_tokens", "tokens decoded (sum of decode batch sizes)"),
            ("prefill_tokens", "prompt tokens prefilled"), ("max_decode_batch", "largest decode batch seen"),
            ("requests_started", "requests accepted"), ("requests_finished", "requests whose final response was sent"),
            ("prefix_cache_hit_rate", "share of admitted prompt tokens found in the prefix cache"),
            ("cached_tokens", "prompt tokens found in the prefix cache"),
            ("refused", "requests refused because max_waiting_seqs were waiting (UNAVAILABLE)"),
            ("running_seqs", "sequences decoding now"), ("waiting_seqs", "sequences waiting for their prefill"),
            ("kv_blocks_used", "KV-cache blocks held by sequences (cached, unreferenced ones not counted)"),
            ("kv_blocks_total", "KV-cache blocks in all"), ("free_slots", "decode slots free"))}
        self.requests_started = self.requests_finished = 0
        self.request_metrics = ARRequestMetrics(ctx.model_name)
        self._stop = False
        self.loop = EngineThread(self.engine, on_error=lambda e: ctx.log(
            "engine step failed: " + "".join(traceback.format_exception(e))))
        self.delivery = threading.Thread(target=self._deliver_loop, name="ar-delivery", daemon=True)
        self.delivery.start()
        self._publish_metrics()     # the gauges say the engine's size from the start (a reload's too)

    def input_limits(self) -> dict:
        return {"input_ids": (self.params.max_model_len,)}      # a longer prompt can never fit the context

    def warmup_inputs(self, spec) -> list[dict]:
        """Prompts of random ids of each `tokens` length (default 16), a few tokens each, greedy and
        sampled (top-k, top-p: the sampler's other path)."""
        rng = np.random.default_rng(0)
        vocab = self.engine.vocab_size
        greedy = {"max_tokens": 4, "temperature": 0.0, "ignore_eos": True, "seed": 0}
        sampled = {**greedy, "temperature": 0.7, "top_p": 0.9, "top_k": 20}
        # a chat request's answer is split into reasoning and content (reply_options; text models only)
        chat = "reply_options" in {t.name for t in self.inputs} and hasattr(self, "markers")
        options = [{}] + ([{"reply_options": string_array('{"reasoning": true}')}] if chat else [])
        return [{"input_ids": rng.integers(0, vocab, n, dtype=np.int32), "sampling": string_array(json.dumps(s)),
                 "stream": np.array([True]), **o}
                for n in spec.tokens or [16] if n + 4 <= self.params.max_model_len for s in (greedy, sampled)
                for o in options]

    def make_engine(self, folder) -> LLMEngine:
        """The engine (a subclass may decode another kind of model: see tts/frame_talker.py)."""
        engine, tokenizer = build_engine(folder, self.params, self.ctx.device, prompt_embeds=self.spliced_prompts)
        self.token_bytes = token_byte_table(tokenizer)
        self.markers = MarkerIds.of(tokenizer)
        return engine

    # -- Triton's thread ----------------------------------------------------------------------
    def submit(self, request: Request, sink: ResponseSink) -> None:
        if self.handle_abort(request, sink):
            return
        sink = self.wrap_sink(request, sink)
        ids = request.get("input_ids")
        if ids is None or ids.ndim != 1:
            raise InvalidInput("input_ids", "expected a 1-D list of token ids")
        params = SamplingParams.from_resolved(request.json("sampling"))    # the pre step checked it
        options = ReplyOptions.from_json(request.json("reply_options"))
        streaming = bool(request.scalar("stream", False))
        group = Group(params.n)
        replies = []
        for i in range(params.n):
            reply = Reply(sink, TokenStream(self.token_bytes, params.stop), streaming, int(ids.shape[0]), index=i,
                          group=group)
            if options.reasoning or options.tools:
                reply.splitter = ChannelSplitter(self.markers, options.reasoning, options.tools,
                                                 opens_reasoning(ids.tolist(), self.markers))
            reply.logprobs = collections.deque() if params.logprobs is not None else None
            reply.echo = ids.tolist() if options.echo else []
            replies.append(reply)
        thinking = replies[0].splitter is not None and replies[0].splitter.channel != CONTENT
        self.start(request, replies, ids, params, thinking, self.prompt_embeds(request, ids))

    spliced_prompts = False         # an engine for prompts with spliced embeddings (ar/embeds_step.py)

    def prompt_embeds(self, request: Request, ids):
        """The request's spliced prompt embeddings (ar/embeds_step.py reads them); a text step has none."""
        return None

    def handle_abort(self, request: Request, sink: ResponseSink) -> bool:
        """True if this request is the front's abort for others (then it is answered here): their
        request ids, joined by ","."""
        abort_ids = request.string(ABORT_INPUT)
        if abort_ids is None:
            return False
        for abort_id in abort_ids.split(","):
            self._abort(abort_id)
        sink.send({}, final=True)
        return True

    def start(self, request: Request, replies, prompt, params: SamplingParams, thinking: bool = False,
              embeds=None) -> None:
        """Queue the request on the engine; its outputs go to the delivery thread. `replies`: one Reply,
        or one per sample (n > 1), in sample order. `embeds`: its spliced prompt embeddings
        (ar/prompt_embeds.PromptEmbeds; ar/embeds_step.py)."""
        replies = replies if isinstance(replies, list) else [replies]
        for r in replies:          # before the engine has it: a fast finish must find it (warmup's ids)
            r.request_id = request.request_id
        put = self.outbox.put
        seq = self.engine.add(prompt, params, thinking=thinking, embeds=embeds,
                              on_output=lambda s, new, reason: put((replies[s.index], new, reason, s.new_logprobs)))
        self.requests_started += 1          # accepted (a refused or invalid one raised above)
        for reply, s in zip(replies, [seq, *seq.forks]):
            reply.seq = s
        reply = replies[0]
        with self.live_lock:
            if reply.request_id and self.aborted.pop(reply.request_id, None) is not None:
                for r in replies:
                    r.done = True
                self.engine.abort(seq, with_forks=True)
                raise Cancelled("request cancelled")
            if not reply.done:
                self.live.add(reply)     # polled for cancellation until it finishes (the first sample stands for all)

    def wrap_sink(self, request: Request, sink: ResponseSink) -> ResponseSink:
        """Where a subclass reshapes this request's responses (e.g. a talker feeding a codec)."""
        return sink

    # -- the delivery thread ------------------------------------------------------------------
    def _deliver_loop(self) -> None:
        last_check = time.monotonic()
        while not self._stop:
            items = []
            try:
                items.append(self.outbox.get(timeout=CANCEL_CHECK_S))
                while True:                       # take everything queued: one response per reply
                    items.append(self.outbox.get_nowait())
            except queue.Empty:
                pass
            try:
                self._deliver_batch(items)
            except Exception as exc:  # noqa: BLE001 - one broken reply must not stop delivery
                self.ctx.log(f"delivery failed: {exc!r}")
            if time.monotonic() - last_check >= CANCEL_CHECK_S:
                last_check = time.monotonic()
                self._check_cancelled()
                self._publish_metrics()
                metrics.flush()

    def _deliver_batch(self, items) -> None:
        """Engine outputs queued since the last round, merged per reply: when sending falls behind
        the engine, a response carries several tokens instead of the backlog growing."""
        merged: dict[Reply, list] = {}
        now = time.time()
        for reply, new, reason, *lps in items:
            entry = merged.setdefault(reply, [[], None, False])
            if reason == CANCEL:
                entry[2] = True
            else:
                entry[0] += new or []
                if new and not reply.first_token_at:
                    reply.first_token_at = now
                entry[1] = reason if reason is not None else entry[1]
                if reply.logprobs is not None and lps and lps[0]:
                    reply.logprobs.extend(lps[0])
        for reply, (new, reason, cancel) in merged.items():
            if reply.done:
                continue
            if cancel:
                self._cancel(reply)
            else:
                self._deliver(reply, new, reason)

    def _deliver(self, reply: Reply, new: list[int], reason: str | None) -> None:
        released, stop_hit = reply.tokens.push(new)
        if stop_hit is not None:
            self.engine.abort(reply.seq)
            reason = "stop"
        elif reason is not None:
            released += reply.tokens.flush()
        reply.n_released += len(released)
        released = self._tag(reply, released, reason is not None)
        if not reply.streaming:
            reply.unsent += released
            if reason is not None:
                self._send(reply, [], reply.unsent, stop_hit, reason)
        elif released or reason is not None:
            reply.unsent += released
            if reason is None and reply.n_responses and len(reply.unsent) < self.stream_interval():
                return
            self._send(reply, reply.context, reply.unsent, stop_hit, reason)
            reply.context = (reply.context + [t for t, _, _ in reply.unsent])[-CONTEXT_TOKENS:]
            reply.unsent = []
        if reason is not None:
            self._close(reply)

    def stream_interval(self) -> int:
        n = self.params.stream_interval
        return n if n > 0 else 1 + len(self.live) // STREAMS_PER_TOKEN

    def _tag(self, reply: Reply, released: list[int], last: bool) -> list[tuple]:
        """Released tokens as (token, channel, logprob entry or None): their chat channel (text/channels.py;
        CONTENT without a splitter, and a tool call's tokens held until it closes) and their logprobs."""
        lps = reply.logprobs
        if reply.splitter is None:
            pairs = [(t, CONTENT) for t in released]
        else:
            pairs = reply.splitter.push(released) + (reply.splitter.flush() if last else [])
        return [(t, ch, lps.popleft() if lps else None) for t, ch in pairs]

    def _send(self, reply: Reply, context: list[int], new: list, stop: str | None, reason: str | None) -> None:
        """`new`: (token, channel, logprob) triples (ar/step.py's `_tag`)."""
        final = False
        if reason is not None:
            reply.group.left -= 1
            final = reply.group.left <= 0
        self.requests_finished += final
        reply.n_responses += 1
        echo, reply.echo = reply.echo, []
        tokens, channels = echo + [t for t, _, _ in new], [CONTENT] * len(echo) + [c for _, c, _ in new]
        logprobs = [[t, lp[0], [list(x) for x in lp[1]]] for t, c, lp in new if lp is not None and c == CONTENT] \
            if reply.logprobs is not None else None
        reply.sink.send({
            "token_ids": np.asarray(context + tokens, dtype=np.int32),
            "num_context": np.asarray([len(context)], dtype=np.int32),
            "stop_text": string_array(stop or ""),
            "finish_reason": string_array(reason or ""),
            "prompt_tokens": np.asarray([reply.prompt_len], dtype=np.int32),
            "completion_tokens": np.asarray([reply.n_released], dtype=np.int32),
            "token_channels": np.asarray([CONTENT] * len(context) + channels, dtype=np.int32),
            "index": np.asarray([reply.index], dtype=np.int32),
            "cached_tokens": np.asarray([reply.seq.num_cached if reply.seq is not None else 0], dtype=np.int32),
            "reasoning_tokens": np.asarray([reply.splitter.reasoning_tokens if reply.splitter else 0], dtype=np.int32),
            "token_logprobs": string_array(json.dumps(logprobs) if logprobs is not None else ""),
        }, final=final)

    def _close(self, reply: Reply) -> None:
        with self.live_lock:
            closing, reply.done = not reply.done, True
            self.live.discard(reply)
        if closing and not warmup.is_warmup(reply.request_id):
            self.request_metrics.finished(reply.seq, reply.first_token_at, reply.n_released)

    def _cancel(self, reply: Reply) -> None:
        """End a cancelled request with a normal final response: an error mid-stream would not
        reach the model's front (Triton 2.51 drops it on the way to a BLS caller)."""
        self._close(reply)
        self.engine.abort(reply.seq, with_forks=True)
        reply.group.left = 1                 # the request ends here, whichever samples were still running
        self._send(reply, [], [], None, "cancelled")

    def _check_cancelled(self) -> None:
        """Ask Triton about a few live requests per round (each question is a round trip to the
        server), so a full batch is covered every few rounds without flooding the channel."""
        with self.live_lock:
            live = sorted(self.live, key=lambda r: r.last_checked)[:CANCEL_CHECKS_PER_ROUND]
        for reply in live:
            reply.last_checked = time.monotonic()
            if not reply.done and reply.sink.is_cancelled():
                self._cancel(reply)

    def _abort(self, request_id: str) -> None:
        """An abort sent by the model's front: the client of `request_id` cancelled. The request
        may not have reached this step yet (still in pre): remember the id for a while. The
        cancellation itself runs on the delivery thread, which owns every reply."""
        now = time.monotonic()
        with self.live_lock:
            match = [r for r in self.live if r.request_id == request_id and not r.done]
            self.aborted = {k: t for k, t in self.aborted.items() if now - t < ABORT_MEMORY_S}
            if not match:
                self.aborted[request_id] = now
        for reply in match:
            self.outbox.put((reply, None, CANCEL))

    def _publish_metrics(self) -> None:
        s, occupancy = self.engine.stats, self.engine.occupancy()
        for key, gauge in self.metrics.items():
            gauge.set(occupancy[key] if key in occupancy else getattr(s, key) if hasattr(s, key) else getattr(self, key))

    def close(self) -> None:
        self._stop = True
        self.loop.stop()
        self.delivery.join(timeout=5)
