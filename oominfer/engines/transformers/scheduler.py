"""Continuous batching on one worker thread, and recovery from out-of-memory errors.

The worker owns the model. It keeps a *running batch* of at most ``max_num_seqs`` sequences,
left-padded, with one ``DynamicCache`` and a 2-D attention mask (positions come from the mask's
cumulative sum). Each iteration it admits waiting requests into the free slots (their prompts
are prefilled together, then their caches are concatenated onto the running batch's; a group
holds at most ``max_prefill_tokens`` padded tokens, the prefill peak the plan sized, and pads
no prompt to more than ``PADDED_GROUP_WIDTH`` tokens), runs one
decode step for the whole batch, hands each sequence its token, and drops finished rows
(``batch_select_indices``) and all-padding columns. Concurrent requests therefore share every
decode forward pass. Requests beyond the free slots wait in a bounded queue (``--max-queue``);
past it ``submit`` raises 429 with ``Retry-After``, and 503 while shutting down. A sequence
whose client went away is dropped before its next step, or skipped when its turn comes. An
unexpected error while handling one sequence's token fails that sequence alone.

Out of memory (``torch.OutOfMemoryError``; on the CPU a ``MemoryError`` or a ``RuntimeError``
from a failed allocation): the cache of the failed forward is dropped, garbage is collected
(``torch.cuda.empty_cache()`` on CUDA, ``malloc_trim`` on glibc), and the sequences go back to
the head of the queue with the batch size capped at half. A sequence keeps the tokens it has
produced: it is re-prefilled from prompt plus output, so its stream continues where it was. A
single sequence that fails on its own gets HTTP 507 (or an error event in its stream); the
others carry on. The cap doubles back after ``CAP_RECOVERY_STEPS`` clean decode steps.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from typing import Final, Literal

import torch

from oominfer.engines.transformers.kv import (
    Batch,
    cache_bytes,
    can_merge,
    merge_batches,
    select_rows,
)
from oominfer.engines.transformers.metrics import Metrics, SchedulerStats
from oominfer.engines.transformers.oom import is_out_of_memory, release_memory
from oominfer.engines.transformers.protocol import RETRY_AFTER_S, ApiError, busy, shutting_down
from oominfer.engines.transformers.runner import ModelRunner
from oominfer.engines.transformers.sequence import ErrorEvent, FinishEvent, Seq, TokenEvent, sample
from oominfer.memory.transformers import PADDED_GROUP_WIDTH

log = logging.getLogger("oominfer.transformers")

CAP_RECOVERY_STEPS: Final = 64
"""Clean decode steps after which an out-of-memory cap on the batch size doubles back."""


class Scheduler:
    """One worker thread that batches sequences and survives out-of-memory errors."""

    def __init__(
        self,
        engine: ModelRunner,
        *,
        max_num_seqs: int,
        max_queue: int,
        metrics: Metrics,
        max_prefill_tokens: int | None = None,
        padded_group_width: int = PADDED_GROUP_WIDTH,
    ) -> None:
        """Create the scheduler; call ``start()`` to run its worker.

        ``max_prefill_tokens`` bounds one prefill group: its prompts are padded to the
        longest, so a group of n holds n x that length (a single longer prompt still runs
        alone). The plan's memory holds one forward pass of that many tokens. Prompts of
        unequal length share a group only up to ``padded_group_width`` tokens wide: their
        padding mask grows with the square of the width (memory/transformers.py
        PADDED_GROUP_WIDTH).
        """
        self.engine = engine
        self.max_prefill_tokens = max_prefill_tokens
        self.padded_group_width = padded_group_width
        self.max_num_seqs = max_num_seqs
        self.max_queue = max_queue
        self.metrics = metrics
        self.cap = max_num_seqs
        self._clean_steps = 0
        self._cond = threading.Condition()
        self._waiting: deque[Seq] = deque()
        self._resume: deque[Seq] = deque()
        self._batch: Batch | None = None
        self._merge: bool | None = None
        self._accepting = True
        self._stop = False
        self._thread = threading.Thread(target=self._run, name="oominfer-scheduler", daemon=True)

    @property
    def queue_depth(self) -> int:
        """Sequences waiting for a slot (new ones and ones being retried)."""
        return len(self._waiting) + len(self._resume)

    @property
    def batch_size(self) -> int:
        """Sequences in the running batch."""
        batch = self._batch
        return len(batch.seqs) if batch is not None else 0

    def kv_cache_bytes(self) -> int:
        """Bytes of the running batch's keys and values."""
        return cache_bytes(self._batch)

    def stats(self) -> SchedulerStats:
        """The gauges ``/metrics`` shows, read now."""
        return SchedulerStats(
            forward_passes=self.engine.forward_passes,
            queue_depth=self.queue_depth,
            batch_size=self.batch_size,
            max_num_seqs=self.max_num_seqs,
            cap=self.cap,
            kv_cache_bytes=self.kv_cache_bytes(),
            weights_bytes=self.engine.weights_bytes,
        )

    def start(self) -> None:
        """Start the worker thread."""
        self._thread.start()

    def submit(self, seq: Seq) -> None:
        """Queue a sequence.

        Raises:
            ApiError: 503 when shutting down, 429 when the queue is full.
        """
        with self._cond:
            if not self._accepting:
                raise shutting_down()
            if len(self._waiting) >= self.max_queue:  # drop those whose clients left first
                self._waiting = deque(s for s in self._waiting if not s.cancelled)
            if len(self._waiting) >= self.max_queue:
                raise busy(
                    f"The server is busy: {len(self._waiting)} requests are already waiting "
                    f"(--max-queue {self.max_queue}). Retry after {RETRY_AFTER_S} s."
                )
            self._waiting.append(seq)
            self.metrics.prompt_tokens.inc(len(seq.prompt))
            self._cond.notify()

    def stop_accepting(self) -> None:
        """Refuse new sequences (503); those queued or running go on."""
        with self._cond:
            self._accepting = False

    def idle(self) -> bool:
        """True when nothing is queued or running."""
        return not self._waiting and not self._resume and self._batch is None

    def abort_all(self, message: str) -> None:
        """Fail every queued and running sequence with 503 (the grace period is over)."""
        with self._cond:
            self._accepting = False
            self._stop = True
            self._cond.notify()
        self._thread.join(timeout=30)
        error = busy(message, 503)
        pending = list(self._waiting) + list(self._resume)
        if self._batch is not None:
            pending += self._batch.seqs
        for seq in pending:
            self._fail(seq, error)
        self._waiting.clear()
        self._resume.clear()
        self._batch = None

    def close(self) -> None:
        """Stop the worker (after ``abort_all`` or when idle)."""
        with self._cond:
            self._stop = True
            self._cond.notify()
        if self._thread.is_alive():
            self._thread.join(timeout=30)

    # worker side

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._stop and self.idle():
                    self._cond.wait()
                if self._stop:
                    return
                group = self._admit()
            try:
                if group:
                    self._prefill(group)
                if self._batch is not None:
                    self._step()
            except Exception:  # a bug must not kill the worker: fail what ran, keep serving
                log.exception("Unexpected error in the scheduler")
                involved = (self._batch.seqs if self._batch else []) + group
                self._batch = None
                for seq in involved:
                    self._fail(seq, ApiError(500, "Internal error while generating.",
                                             type_="internal_error"))  # fmt: skip

    def _admit(self) -> list[Seq]:
        """Take sequences for the free slots: retried ones first, then new ones."""
        running = self.batch_size
        if running and self._merge is False:
            return []  # a cache that cannot take new rows: wait for the batch to drain
        free = min(self.max_num_seqs, self.cap) - running
        group: list[Seq] = []
        width = 0
        even = True  # every prompt of the group has the same length: no padding, no mask
        for source in (self._resume, self._waiting):
            while source and len(group) < free:
                seq = source[0]
                if seq.cancelled or seq.done:
                    source.popleft()
                    continue
                if seq.solo and (running or group):
                    return group
                wider = max(width, len(seq.ids))
                limit = self.max_prefill_tokens
                if group and limit is not None and (len(group) + 1) * wider > limit:
                    return group  # the rest wait for the next iteration
                padded = not (even and (not group or len(seq.ids) == width))
                if group and padded and wider > self.padded_group_width:
                    return group  # its mask would grow with the square of the width
                source.popleft()
                group.append(seq)
                width, even = wider, not padded
                if seq.solo:
                    return group
        return group

    def _prefill(self, group: list[Seq]) -> None:
        try:
            cache, mask, logits = self.engine.prefill([s.ids for s in group])
        except Exception as err:
            if not is_out_of_memory(err):
                raise
            self._out_of_memory(group, err, batch_lost=False)
            return
        if self._merge is None:
            self._merge = can_merge(cache)
        tokens = sample(logits, group, self._broken)
        self._accept_all(group, tokens)
        new = Batch(cache=cache, mask=mask, last=torch.tensor(tokens, device=mask.device),
                    seqs=group)  # fmt: skip
        keep = [i for i, s in enumerate(group) if not s.done]
        if not keep:
            return
        if len(keep) < len(group):
            new = select_rows(new, keep, trim=bool(self._merge))
        if self._batch is None:
            self._batch = new
            return
        try:
            self._batch = merge_batches(self._batch, new)
        except Exception as err:
            if not is_out_of_memory(err):
                raise
            self._out_of_memory(self._batch.seqs + new.seqs, err, batch_lost=True)

    def _step(self) -> None:
        batch = self._batch
        assert batch is not None
        if any(s.done or s.cancelled for s in batch.seqs):
            batch = self._prune(batch)
            if batch is None:
                return
        try:
            logits = self.engine.decode(batch)
        except Exception as err:
            if not is_out_of_memory(err):
                raise
            self._out_of_memory(batch.seqs, err, batch_lost=True)
            return
        tokens = sample(logits, batch.seqs, self._broken)
        batch.last = torch.tensor(tokens, device=batch.mask.device)
        self._accept_all(batch.seqs, tokens)
        self._prune(batch)
        self._clean_steps += 1
        if self.cap < self.max_num_seqs and self._clean_steps >= CAP_RECOVERY_STEPS:
            self.cap = min(self.max_num_seqs, self.cap * 2)
            self._clean_steps = 0
            log.info("Batch size cap raised to %d after %d clean steps.", self.cap,
                     CAP_RECOVERY_STEPS)  # fmt: skip

    def _prune(self, batch: Batch) -> Batch | None:
        keep = [i for i, s in enumerate(batch.seqs) if not (s.done or s.cancelled)]
        if len(keep) == len(batch.seqs):
            self._batch = batch
        elif not keep:
            self._batch = None
            if self.idle():
                release_memory(self.engine.device, collect=False)
        else:
            self._batch = select_rows(batch, keep, trim=bool(self._merge))
        return self._batch

    def _out_of_memory(self, seqs: list[Seq], err: BaseException, *, batch_lost: bool) -> None:
        """Free memory, then retry ``seqs`` in halves; a lone sequence that failed fails."""
        if batch_lost:
            self._batch = None
        release_memory(self.engine.device)
        alive = [s for s in seqs if not (s.done or s.cancelled)]
        if len(alive) > 1:
            self.cap = max(1, len(alive) // 2)
            self._clean_steps = 0
            self.metrics.oom_recoveries.inc()
            log.warning(
                "Out of memory with %d sequences (%s); retrying them in batches of at most %d.",
                len(alive), err, self.cap,
            )  # fmt: skip
            self._resume.extendleft(reversed(alive))
            return
        if not alive:
            return
        seq = alive[0]
        if self._batch is not None and not seq.solo:
            log.warning("Out of memory on one sequence beside %d others: retrying it alone.",
                        len(self._batch.seqs))  # fmt: skip
            seq.solo = True
            self._resume.appendleft(seq)
            return
        self.metrics.oom_failures.inc()
        log.warning("Out of memory on a single sequence of %d tokens: failing it (%s).",
                    len(seq.ids), err)  # fmt: skip
        self._fail(
            seq,
            ApiError(
                507,
                f"Out of memory: this request ({len(seq.prompt)} prompt tokens, max_tokens "
                f"{seq.max_tokens}) does not fit in the memory left on this server, even alone. "
                "Send a shorter prompt or a smaller max_tokens, or serve with a smaller "
                "--max-model-len.",
                type_="insufficient_storage",
                code="out_of_memory",
            ),
        )

    def _accept_all(self, seqs: list[Seq], tokens: list[int]) -> None:
        for seq, token in zip(seqs, tokens, strict=True):
            try:
                self._accept(seq, token)
            except Exception as err:
                self._broken(seq, err)

    def _broken(self, seq: Seq, err: Exception) -> None:
        """A bug met while handling one sequence fails that one only."""
        log.error("Unexpected error on one sequence; failing it alone.", exc_info=err)
        self._fail(seq, ApiError(500, "Internal error while generating.", type_="internal_error"))

    def _accept(self, seq: Seq, token: int) -> None:
        """Hand one sampled token to its sequence: text, stop conditions, events."""
        if seq.done or seq.cancelled:
            return
        seq.completion_tokens += 1
        self.metrics.generation_tokens.inc()
        if token in self.engine.eos_ids and not seq.ignore_eos:
            self._finish(seq, "stop")
            return
        seq.generated.append(token)
        text = self.engine.tokenizer.decode(seq.generated, skip_special_tokens=True)
        reason: Literal["stop", "length"] | None = None
        if seq.stop:
            start = max(0, len(seq.sent) - max(len(s) for s in seq.stop))
            hits = [i for i in (text.find(s, start) for s in seq.stop) if i >= 0]
            if hits:
                text, reason = text[: min(hits)], "stop"
        if reason is None and len(seq.generated) >= seq.max_tokens:
            reason = "length"
        if reason is None and text.endswith("\ufffd"):
            return  # an incomplete multi-byte character: wait for its other bytes
        if seq.stop and reason is None:
            # hold back a tail that could be the start of a stop string
            hold = max(len(s) for s in seq.stop) - 1
            text = text[: max(len(seq.sent), len(text) - hold)]
        if len(text) > len(seq.sent):
            seq.emit(TokenEvent(text[len(seq.sent) :]))
            seq.sent = text
        if reason is not None:
            self._finish(seq, reason)

    def _finish(self, seq: Seq, reason: Literal["stop", "length"]) -> None:
        seq.done = True
        seq.emit(FinishEvent(reason, len(seq.prompt), seq.completion_tokens))

    def _fail(self, seq: Seq, error: ApiError) -> None:
        if seq.done:
            return
        seq.done = True
        seq.emit(ErrorEvent(error))
