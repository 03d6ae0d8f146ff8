"""The AR engine: requests in from any thread, one scheduled step at a time, tokens out.

`add` and `abort` only post to an inbox; the thread that calls `step` (the engine loop) owns every
piece of state, so no locks are held around the model. Each finished or growing sequence is
reported through its `on_output(seq, new_token_ids, finish_reason)` callback, on the loop thread.
For a frame model (model_runner.FrameModel, e.g. a TTS talker) a prompt is the model's own object
and each new "token" is a frame, a list of N codes.
"""
from __future__ import annotations

import json
import os
import queue
import threading
import time
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from triton_omni.ar.bookkeeping_reference import FINISH_LENGTH, FINISH_STOP
from triton_omni.ar.block_manager import BlockManager
from triton_omni.ar.config import EngineConfig
from triton_omni.ar.forks import make_forks
from triton_omni.ar.model_runner import ModelRunner, StepHandle
from triton_omni.ar.prompt_embeds import PromptEmbeds, attach as attach_embeds
from triton_omni.ar.sampling import SamplingParams
from triton_omni.ar.scheduler import Scheduler
from triton_omni.ar.sequence import Sequence, Status
from triton_omni.models.context import RecurrentStateSpec
from triton_omni.runtime.errors import InvalidInput, Unavailable


TRACE_ENV = "TRITON_OMNI_ENGINE_TRACE"


class StepTrace:
    """The engine loop's timeline, for profiling (TRITON_OMNI_ENGINE_TRACE=FILE in the environment of
    the process that runs the engine, e.g. tritonserver's): a JSON line per step with its wall-clock
    start `t` (s), the arrival times of the requests it took from the inbox, its kind, rows and prompt
    tokens, and the host time to launch it and to collect the step before it (which waits for the
    GPU). Lines are written when the loop goes idle or stops, or 10,000 at a time."""

    def __init__(self, path: str):
        self.path, self.lines = path, []

    def step(self, t: float, arrivals: list[float], batch, launched: float) -> None:
        """A step that started at `t` and launched `batch` (a scheduler Batch, or None) by `launched`."""
        now = time.time()
        kind = "idle" if batch is None else "prefill" if batch.is_prefill else "decode"
        tokens = sum(s.prompt_len for s in batch.seqs) if kind == "prefill" else 0
        self.lines.append(json.dumps({"t": t, "arrivals": arrivals, "kind": kind, "rows": len(batch.seqs) if batch else 0,
                                      "tokens": tokens, "launch_ms": 1e3 * (launched - t),
                                      "collect_ms": 1e3 * (now - launched)}))
        if len(self.lines) >= 10000:        # a loop that never idles: write as it goes
            self.flush()

    def flush(self) -> None:
        if self.lines:
            with open(self.path, "a") as f:
                f.write("\n".join(self.lines) + "\n")
            self.lines = []


@dataclass
class EngineStats:
    prefill_steps: int = 0
    prefill_tokens: int = 0         # prompt tokens prefilled (those found in the prefix cache are not)
    decode_steps: int = 0
    decode_tokens: int = 0          # sum of decode batch sizes
    max_decode_batch: int = 0
    prompt_tokens: int = 0          # prompt tokens admitted
    cached_tokens: int = 0          # ... of which the prefix cache held
    refused: int = 0                # requests refused because max_waiting_seqs were waiting

    @property
    def prefix_cache_hit_rate(self) -> float:
        return self.cached_tokens / self.prompt_tokens if self.prompt_tokens else 0.0


class LLMEngine:
    def __init__(self, model: nn.Module, config: EngineConfig, device: torch.device | str,
                 dtype: torch.dtype, eos_token_ids: list[int], vocab_size: int,
                 think_ids: tuple[int, int] | None = None, grammar=None, prompt_embeds: bool = False):
        """`think_ids`: the tokens that open and close reasoning (a reasoning budget forces the second);
        `grammar`: structured output's compiler (ar/grammar.py), None: refused; `prompt_embeds`: requests
        may carry spliced embeddings and rotary positions (ar/prompt_embeds.py)."""
        self.config = config
        self.device = torch.device(device)
        self.eos_token_ids = set(eos_token_ids)
        if len(self.eos_token_ids) > 8:
            raise ValueError("at most 8 end-of-sequence token ids")
        self.vocab_size = vocab_size
        self.grammar = grammar
        self.runner = ModelRunner(model, config, self.device, dtype, vocab_size, think_ids, prompt_embeds)
        if self.runner.num_blocks * config.block_size < config.max_model_len:
            raise ValueError("the KV cache cannot hold one sequence of max_model_len tokens")
        # Qwen3.5's recurrent layers would need their state at every cached block boundary (see
        # ar/prefix_cache.py's caller notes in README): prefix caching covers attention-only models.
        recurrent = any(isinstance(spec, RecurrentStateSpec) for _, spec in self.runner.layers)
        self.prefix_caching = config.enable_prefix_caching and not recurrent and not self.runner.frame_model
        self.blocks = BlockManager(self.runner.num_blocks, config.block_size, config.max_num_seqs, self.prefix_caching)
        self.scheduler = Scheduler(self.blocks, config.max_num_seqs, config.max_num_batched_tokens)
        self.stats = EngineStats()
        self._inbox: queue.SimpleQueue = queue.SimpleQueue()
        self._wake = threading.Event()
        self._by_id: dict[int, Sequence] = {}
        self.in_flight: StepHandle | None = None
        trace = os.environ.get(TRACE_ENV)
        self.trace = StepTrace(trace) if trace else None

    # -- called from any thread ---------------------------------------------------------------
    def add(self, prompt_ids, params: SamplingParams, on_output=None, thinking: bool = False,
            embeds: PromptEmbeds | None = None) -> Sequence:
        """Validate and queue a request; raises InvalidInput for a bad one. `prompt_ids`: token ids (a list
        or an array), or a frame model's prompt object (anything with a len(): its number of positions).
        `thinking`: the prompt leaves the model inside its reasoning (for a reasoning budget). With n > 1
        the returned sequence is the first sample; `seq.forks` are the others (each reported on its own).
        `embeds`: rows spliced over placeholder tokens and the prompt's rotary positions (an engine
        built with prompt_embeds=True)."""
        if self.runner.frame_model:
            seq = Sequence([], params, on_output, prompt=prompt_ids)
        else:
            ids = np.asarray(prompt_ids, dtype=np.int64)      # checked in numpy: ~10x a Python loop's speed
            if ids.size and (ids.min() < 0 or ids.max() >= self.vocab_size):
                raise InvalidInput("input_ids", f"token ids must be in [0, {self.vocab_size})")
            seq = Sequence(ids.tolist(), params, on_output)
        if embeds is not None:
            attach_embeds(seq, embeds, self.runner)
        seq.arrival = time.time()
        if params.resolved:
            # a pre step resolved it against its own max_model_len, which may be set above this engine's
            params.check_fits(seq.prompt_len, self.config.max_model_len)
        else:                   # in-process callers (benchmarks, tests) and requests sent straight here
            params = params.resolve(seq.prompt_len, self.config.max_model_len, self.vocab_size)
        seq.params = params
        if self.runner.logits is None:          # a frame model samples its own codes: none of these apply
            for name, off in (("min_p", 0.0), ("presence_penalty", 0.0), ("frequency_penalty", 0.0),
                              ("repetition_penalty", 1.0), ("logit_bias", None), ("n", 1), ("logprobs", None),
                              ("guided_decoding", None), ("thinking_budget", None)):
                if getattr(params, name) != off:
                    raise InvalidInput(f"sampling_parameters.{name}", "not supported by this model")
        if params.n > self.config.max_num_seqs:
            raise InvalidInput("sampling_parameters.n", f"{params.n} samples cannot run together: this model "
                               f"decodes at most {self.config.max_num_seqs} sequences at once")
        if params.guided_decoding is not None:
            if self.grammar is None:
                raise InvalidInput("sampling_parameters.guided_decoding", "structured output is not available here")
            seq.matcher = self.grammar.matcher(params.guided_decoding)
        seq.thinking = thinking
        seq.thinking_left = params.thinking_budget if params.thinking_budget is not None else -1
        seq.forks = make_forks(seq)
        self._admit(seq)
        self._inbox.put(("add", seq))
        self._wake.set()
        return seq

    def _waiting(self) -> int:
        """Sequences not yet running: in the inbox and queued for prefill (each sample of n counts)."""
        return self._inbox.qsize() + sum(1 + len(s.forks) for s in list(self.scheduler.waiting))

    def occupancy(self) -> dict[str, int]:
        """Sequences running and waiting, KV blocks held by sequences, free decode slots: the gauges an
        operator watches (a slot or a block still held after the requests ended is a leak)."""
        blocks = self.blocks
        return {"running_seqs": len(self.scheduler.running),
                "waiting_seqs": self._waiting(),
                "kv_blocks_used": blocks.num_blocks - blocks.cache.num_available(),
                "kv_blocks_total": blocks.num_blocks, "free_slots": len(blocks.free_slots)}

    def _admit(self, seq: Sequence) -> None:
        """Refuse `seq` (Unavailable) if the queue for prefill is full. Read from Triton's thread while the
        engine's thread changes it: a count that may be a request or two stale, which a bound needs not mind."""
        bound = self.config.max_waiting_seqs
        if not bound:
            return
        waiting = self._waiting()
        free = max(0, self.config.max_num_seqs - len(self.scheduler.running))   # those start at the next step
        if waiting + 1 + len(seq.forks) > bound + free:
            self.stats.refused += 1
            raise Unavailable(f"{waiting} requests are waiting for this model, the most it queues "
                              f"(max_waiting_seqs = {bound}); retry later")

    def abort(self, seq: Sequence, with_forks: bool = False) -> None:
        """End `seq` (with_forks: and the other samples of its request)."""
        self._inbox.put(("abort_all" if with_forks else "abort", seq))
        self._wake.set()

    # -- the loop thread ----------------------------------------------------------------------
    def has_work(self) -> bool:
        return self.scheduler.has_work() or not self._inbox.empty() or self.in_flight is not None

    def _drain_inbox(self) -> list[float]:
        """Take the posted adds and aborts; returns the added requests' arrival times."""
        arrivals = []
        while True:
            try:
                op, seq = self._inbox.get_nowait()
            except queue.Empty:
                return arrivals
            if op == "add":
                arrivals.append(seq.arrival)
                self._by_id[seq.seq_id] = seq
                self.scheduler.add(seq)
            else:
                for s in (seq, *seq.forks) if op == "abort_all" else (seq,):
                    if s.status is not Status.FINISHED and (s.seq_id in self._by_id or s.parent is not None):
                        self._finish(s, "abort")
                        self._emit(s, [], "abort")

    def _finish(self, seq: Sequence, reason: str) -> None:
        self.scheduler.finish(seq, reason)
        self._by_id.pop(seq.seq_id, None)
        if seq.matcher is not None:
            seq.matcher = None

    @staticmethod
    def _emit(seq: Sequence, new: list[int], reason: str | None) -> None:
        if seq.on_output is not None:
            seq.on_output(seq, new, reason)

    def step(self) -> list[tuple[Sequence, list[int], str | None]]:
        """Launch the next step, then collect the previous one's results while the device works.
        A sequence that ends on a stop token is thus decoded once more; that token is dropped."""
        t = time.time()
        arrivals = self._drain_inbox()
        early: list = []
        if self.in_flight is not None and any(s.matcher is not None for s in self.scheduler.running):
            # a grammar's next mask needs the token in flight: collect it first (this step waits for
            # the device; rows without a grammar batch with these as usual)
            early = self._collect(self.in_flight)
            self.in_flight = None
        hold = self._prefill_hold(t)
        batch = self.scheduler.schedule(prefill=hold <= 0)
        launched = None
        if batch is not None:
            constrained = [s for s in batch.seqs if s.matcher is not None]
            if batch.is_prefill:
                for seq in batch.seqs:
                    seq.scheduled = t
                self.runner.admit(batch.seqs, self.eos_token_ids)
                if constrained:
                    self.runner.load_masks(constrained)
                launched = self.runner.prefill(batch.seqs, self.blocks.fork_copies)
                for seq in batch.seqs:
                    seq.embeds = None           # copied to the device by now: free the rows
                self.blocks.fork_copies = []
                prompts = [s for s in batch.seqs if s.parent is None]
                for s in prompts:
                    self.blocks.register_prompt(s)
                self.stats.prefill_steps += 1
                self.stats.prefill_tokens += sum(s.prompt_len - s.num_cached for s in prompts)
                self.stats.prompt_tokens += sum(s.prompt_len for s in prompts)
                self.stats.cached_tokens += sum(s.num_cached for s in prompts)
            else:
                if constrained:
                    self.runner.load_masks(constrained)
                launched = self.runner.decode(batch.seqs)
                self.stats.decode_steps += 1
                self.stats.decode_tokens += len(batch.seqs)
                self.stats.max_decode_batch = max(self.stats.max_decode_batch, len(batch.seqs))
            for seq in batch.seqs:
                seq.num_launched += 1
        previous, self.in_flight = self.in_flight, launched
        launched_at = time.time()
        outputs = early + (self._collect(previous) if previous is not None else [])
        if batch is None and previous is None and hold > 0:    # nothing to do but wait for prompts
            self._wake.wait(hold)
            self._wake.clear()
        if self.trace is not None:
            self.trace.step(t, arrivals, batch, launched_at)
        return outputs

    def _prefill_hold(self, now: float) -> float:
        """Seconds the waiting prompts should still wait for more to arrive (config.prefill_quiet_ms);
        0: prefill them now."""
        waiting, cfg = self.scheduler.waiting, self.config
        if cfg.prefill_quiet_ms <= 0 or not waiting or self.scheduler.prefill_is_full():
            return 0.0
        quiet = waiting[-1].arrival + cfg.prefill_quiet_ms / 1e3 - now
        deadline = waiting[0].arrival + cfg.prefill_max_wait_ms / 1e3 - now
        return max(0.0, min(quiet, deadline))

    def _collect(self, handle: StepHandle) -> list[tuple[Sequence, list[int], str | None]]:
        tokens, codes = handle.result()
        logprobs = handle.logprobs()
        outputs = []
        for i, (seq, tok, code) in enumerate(zip(handle.seqs, tokens, codes)):
            if seq.status is Status.FINISHED:        # aborted, or ended a step earlier
                continue
            new, reason = [tok], None
            if code == FINISH_STOP:
                new, reason = [], "stop"
            else:
                seq.output_ids.append(tok)
                if code == FINISH_LENGTH:
                    reason = "length"
                if seq.matcher is not None and not seq.matcher.accept(tok):
                    reason = "stop"                  # the grammar is complete (or the token was its stop)
            seq.new_logprobs = [logprobs(i, seq.params.logprobs)] if new and seq.params.logprobs is not None else None
            if reason is not None:
                self._finish(seq, reason)
            outputs.append((seq, new, reason))
        for seq, new, reason in outputs:
            self._emit(seq, new, reason)
        return outputs

    def run_until_done(self) -> None:
        while self.has_work():
            self.step()

    def generate(self, prompts: list[list[int]], params: SamplingParams) -> list[list[int]]:
        """Synchronous helper: run prompts to completion in this thread; returns output ids (frames)."""
        seqs = [self.add(p, params) for p in prompts]
        self.run_until_done()
        return [s.output_ids for s in seqs]


class EngineThread:
    """Runs `engine.step()` in a daemon thread whenever there is work."""

    def __init__(self, engine: LLMEngine, on_error=None):
        self.engine = engine
        self.on_error = on_error
        self._stop = False
        self.thread = threading.Thread(target=self._loop, name="ar-engine", daemon=True)
        self.thread.start()

    def _loop(self) -> None:
        eng = self.engine
        while not self._stop:
            if not eng.has_work():
                if eng.trace is not None:
                    eng.trace.flush()
                eng._wake.wait(timeout=0.5)
                eng._wake.clear()
                continue
            try:
                eng.step()
            except Exception as exc:  # noqa: BLE001 - fail the running requests, keep serving
                if self.on_error is not None:
                    self.on_error(exc)
                eng.in_flight = None
                waiting = [f for s in eng.scheduler.waiting for f in (s, *s.forks)]
                for seq in list(eng.scheduler.running) + waiting:
                    eng._finish(seq, "error")
                    eng._emit(seq, [], "error")
        if eng.trace is not None:
            eng.trace.flush()

    def stop(self) -> None:
        self._stop = True
        self.engine._wake.set()
        self.thread.join(timeout=10)
