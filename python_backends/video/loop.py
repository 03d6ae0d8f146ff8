"""The video denoise step's loop: clips in, one denoising step for every clip per round, progress out.

One thread owns every clip. Each round it admits waiting clips (up to `max_clips` at once), drops
cancelled ones, groups the rest by what can share a model call (the model's `group_key`: latent
shape, expert) and runs one step for each group (`advance`), in calls of at most `max_rows` rows.
A clip joins the next round after it arrives, whatever step the others are at: each clip has its own
timesteps and scheduler state, so nothing waits for a batch to finish.

On a GPU the host runs at most one round ahead of the device: after launching round k it waits for
round k-1's kernels (a CUDA event) and only then reports their progress and hands finished clips
on. So progress is true to within one step, a cancellation takes effect within two, and the device
never idles between rounds.

Watchers: a second request that asks for a clip's progress by the clip's request id (the model's
front opens one beside each request, runtime/front.py). It gets (steps done, steps) after every
step and ends when the clip ends. A watch or an abort may arrive before its clip (which is still in
an earlier step of the ensemble): both are remembered for a while.
"""
from __future__ import annotations

import collections
import queue
import threading
import time
import traceback
from dataclasses import dataclass, field
from typing import Any, Callable, Hashable

import numpy as np
import torch

from triton_omni.runtime.errors import Cancelled
from triton_omni.runtime.step import ResponseSink

CANCEL_CHECK_S = 0.1       # how often each clip's own caller is asked whether it cancelled
REMEMBER_S = 60.0          # how long an early abort, and a finished clip's progress, are kept
WATCH_WAIT_S = 3600.0      # how long a watch waits for its clip before it is ended


@dataclass(eq=False)
class Clip:
    """One request in the loop."""

    request_id: str
    sink: ResponseSink
    steps: int
    inputs: dict[str, Any]                 # the request's checked tensors (the model's `start` reads them)
    state: Any = None                      # the model's: latents, scheduler, conditioning on the device
    launched: int = 0                      # steps queued on the device
    done: int = 0                          # steps finished (reported)
    watchers: list[ResponseSink] = field(default_factory=list)
    cancelled: bool = False
    last_checked: float = 0.0


@dataclass
class LoopStats:
    model_calls: int = 0
    model_rows: int = 0                    # rows of every call together (clips x CFG branches)
    max_call_clips: int = 0                # most clips that shared one call
    clips_started: int = 0
    clips_finished: int = 0
    clips_cancelled: int = 0
    clips_failed: int = 0
    active_clips: int = 0
    waiting_clips: int = 0


class DenoiseLoop:
    """`model` provides: start(clip) (state on the device), group_key(clip), rows(clip) (rows of its
    model call), advance(clips) (one step for a group; clip.launched += 1 each), result(clip) (the
    final response's outputs)."""

    def __init__(self, model, device: str, max_clips: int, max_rows: int, log: Callable[[str], None] = print,
                 on_round: Callable[[LoopStats], None] = lambda s: None):
        self.model, self.max_clips, self.max_rows, self.log, self.on_round = model, max_clips, max_rows, log, on_round
        self.cuda = torch.device(device).type == "cuda"
        self.inbox: queue.SimpleQueue = queue.SimpleQueue()
        self.waiting: collections.deque[Clip] = collections.deque()
        self.active: list[Clip] = []
        self.watchers: dict[str, tuple[float, list[ResponseSink]]] = {}     # request id -> early watches
        self.aborted: dict[str, float] = {}                                  # request id -> when
        self.finished: dict[str, tuple[float, int, int]] = {}                # request id -> (when, done, steps)
        self.stats = LoopStats()
        self._stop = False
        self.thread = threading.Thread(target=self._run, name="video-denoise", daemon=True)
        self.thread.start()

    # -- any thread (Triton's) ------------------------------------------------------------------
    def add(self, clip: Clip) -> None:
        self.inbox.put(("clip", clip))

    def abort(self, request_ids: list[str]) -> None:
        self.inbox.put(("abort", request_ids))

    def watch(self, request_id: str, sink: ResponseSink) -> None:
        self.inbox.put(("watch", request_id, sink))

    def stop(self) -> None:
        self._stop = True
        self.inbox.put(("wake",))
        self.thread.join(timeout=10)

    # -- the loop's thread ----------------------------------------------------------------------
    def _run(self) -> None:
        inflight: tuple[Any, list[Clip]] | None = None
        while not self._stop:
            try:
                idle = not self.active and not self.waiting and inflight is None
                self._take_inbox(block=idle)
                self._check_cancelled()
                self._admit()
                launched = self._launch_round()
                marker = self._mark() if launched else None
                if inflight is not None:
                    self._settle(*inflight)
                inflight = (marker, launched) if launched else None
                if inflight is not None and not self.cuda:      # the CPU computed it already
                    self._settle(*inflight)
                    inflight = None
                self._publish()
            except Exception as exc:  # noqa: BLE001 - the loop must outlive any one round
                self.log("video denoise loop: " + "".join(traceback.format_exception(exc)))
                inflight = None

    def _take_inbox(self, block: bool) -> None:
        items = []
        try:
            if block:
                items.append(self.inbox.get(timeout=CANCEL_CHECK_S))
            while True:
                items.append(self.inbox.get_nowait())
        except queue.Empty:
            pass
        now = time.monotonic()
        for item in items:
            if item[0] == "clip":
                self._arrive(item[1], now)
            elif item[0] == "abort":
                for rid in item[1]:
                    self._abort(rid, now)
            elif item[0] == "watch":
                self._watch(item[1], item[2], now)
        self.aborted = {k: t for k, t in self.aborted.items() if now - t < REMEMBER_S}
        self.finished = {k: v for k, v in self.finished.items() if now - v[0] < REMEMBER_S}
        for rid, (t, sinks) in list(self.watchers.items()):
            if now - t > WATCH_WAIT_S:
                del self.watchers[rid]
                for s in sinks:
                    self._send(s, {}, final=True)

    def _arrive(self, clip: Clip, now: float) -> None:
        self.stats.clips_started += 1
        if clip.request_id and self.aborted.pop(clip.request_id, None) is not None:
            self._cancel(clip)
            return
        clip.watchers += self.watchers.pop(clip.request_id, (0, []))[1] if clip.request_id else []
        clip.last_checked = now
        self.waiting.append(clip)

    def _clips(self, request_id: str) -> list[Clip]:
        return [c for c in (*self.active, *self.waiting) if c.request_id == request_id]

    def _abort(self, request_id: str, now: float) -> None:
        clips = self._clips(request_id)
        for clip in clips:
            clip.cancelled = True           # dropped at the next round's check
        for sink in self.watchers.pop(request_id, (0, []))[1]:
            self._send(sink, {}, final=True)
        if not clips:
            self.aborted[request_id] = now

    def _watch(self, request_id: str, sink: ResponseSink, now: float) -> None:
        clips = self._clips(request_id)
        if clips:
            clips[0].watchers.append(sink)
            if clips[0].done:
                self._send(sink, {"progress": self._progress(clips[0])})
        elif request_id in self.finished:
            _, done, steps = self.finished[request_id]
            self._send(sink, {"progress": np.array([done, steps], np.int32)}, final=True)
        elif request_id in self.aborted:
            self._send(sink, {}, final=True)
        else:
            self.watchers.setdefault(request_id, (now, []))[1].append(sink)

    def _check_cancelled(self) -> None:
        now = time.monotonic()
        for clip in [*self.active, *self.waiting]:
            if not clip.cancelled and now - clip.last_checked >= CANCEL_CHECK_S:
                clip.last_checked = now
                clip.cancelled = clip.sink.is_cancelled()
            if clip.cancelled:
                self._cancel(clip)

    def _remove(self, clip: Clip) -> None:
        if clip in self.active:
            self.active.remove(clip)
        if clip in self.waiting:
            self.waiting.remove(clip)
        clip.state = None                   # its device memory goes now, not when Python collects it

    def _cancel(self, clip: Clip) -> None:
        self._remove(clip)
        clip.cancelled = True
        self.stats.clips_cancelled += 1
        self._send(clip.sink, Cancelled("request cancelled"))
        for sink in clip.watchers:
            self._send(sink, {}, final=True)

    def _fail(self, clip: Clip, exc: BaseException) -> None:
        self._remove(clip)
        clip.cancelled = True               # out of every later round
        self.stats.clips_failed += 1
        self._send(clip.sink, exc)
        for sink in clip.watchers:
            self._send(sink, {}, final=True)

    def _admit(self) -> None:
        while self.waiting and len(self.active) < self.max_clips:
            clip = self.waiting.popleft()
            try:
                with torch.inference_mode():
                    self.model.start(clip)
                self.active.append(clip)
            except Exception as exc:  # noqa: BLE001 - this clip fails alone
                self._fail(clip, exc)

    def _launch_round(self) -> list[Clip]:
        """One step for every active clip that has steps left to launch; returns those clips."""
        groups: dict[Hashable, list[Clip]] = {}
        for clip in self.active:
            if clip.launched < clip.steps:
                groups.setdefault(self.model.group_key(clip), []).append(clip)
        launched = []
        for group in groups.values():
            for chunk in self._chunks(group):
                try:
                    with torch.inference_mode():
                        self.model.advance(chunk)
                    rows = sum(self.model.rows(c) for c in chunk)
                    self.stats.model_calls += 1
                    self.stats.model_rows += rows
                    self.stats.max_call_clips = max(self.stats.max_call_clips, len(chunk))
                    launched += chunk
                except Exception as exc:  # noqa: BLE001 - this call's clips fail, the others go on
                    self.log("video denoise step failed: " + "".join(traceback.format_exception(exc)))
                    for clip in chunk:
                        self._fail(clip, exc)
        # a clip whose last step is queued takes no more rounds; it is handed on once that step is done
        self.active = [c for c in self.active if c.launched < c.steps]
        return launched

    def _chunks(self, group: list[Clip]) -> list[list[Clip]]:
        chunks, rows = [[]], 0
        for clip in group:
            r = self.model.rows(clip)
            if chunks[-1] and rows + r > self.max_rows:
                chunks.append([])
                rows = 0
            chunks[-1].append(clip)
            rows += r
        return chunks

    def _mark(self):
        if not self.cuda:
            return None
        event = torch.cuda.Event()
        event.record()
        return event

    def _settle(self, marker, clips: list[Clip]) -> None:
        """The round behind `marker` is done: report each clip's step, hand finished clips on."""
        if marker is not None:
            marker.synchronize()
        for clip in clips:
            if clip.cancelled:
                continue
            clip.done += 1
            progress = self._progress(clip)
            last = clip.done == clip.steps
            for sink in clip.watchers:
                self._send(sink, {"progress": progress}, final=last)
            if last:
                try:
                    outputs = self.model.result(clip)
                except Exception as exc:  # noqa: BLE001
                    self._fail(clip, exc)
                    continue
                clip.state = None
                self.stats.clips_finished += 1
                if clip.request_id:
                    self.finished[clip.request_id] = (time.monotonic(), clip.done, clip.steps)
                self._send(clip.sink, outputs, final=True)

    def _send(self, sink: ResponseSink, outputs: dict | BaseException, final: bool = True) -> None:
        """A response, or an error (final); a stream that is gone (its client left) fails alone, never the round."""
        try:
            if isinstance(outputs, BaseException):
                sink.error(outputs)
            else:
                sink.send(outputs, final=final)
        except Exception as exc:  # noqa: BLE001
            self.log(f"video denoise loop: a response could not be sent: {exc!r}")

    @staticmethod
    def _progress(clip: Clip) -> np.ndarray:
        return np.array([clip.done, clip.steps], np.int32)

    def _publish(self) -> None:
        self.stats.active_clips, self.stats.waiting_clips = len(self.active), len(self.waiting)
        self.on_round(self.stats)
