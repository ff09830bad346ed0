"""Keep serving when a batch would run out of memory: undo it, then retry smaller or fail.

More: docs/scheduler.md, "scheduler/oom_recovery.py".
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Callable

import torch

from radixlm.executor.forward_worker import batch_shape as forward_batch_shape
from radixlm.planning.activation_guard import ActivationBudgetExceeded
from radixlm.planning.oom import BatchShape, OOMDiagnosis, diagnose_oom
from radixlm.scheduler.queues import Queues, RunLimits
from radixlm.scheduler.req import Req
from radixlm.scheduler.request_kv import RequestKV

if TYPE_CHECKING:
    from radixlm.executor.model_runner import ModelRunner
    from radixlm.scheduler.schedule_batch import ScheduleBatch

logger = logging.getLogger(__name__)


def batch_shape(batch: "ScheduleBatch") -> BatchShape:
    return forward_batch_shape(batch.forward_batch)


class OOMRecovery:
    """`runner`: the memory plan, the device and its activation guard (read at each check);
    `settle`: process the launched batch still in flight (overlap); `answer`: send a
    finished request's last output; `note`: show a diagnosis (the dashboard)."""

    def __init__(self, kv: RequestKV, queues: Queues, limits: RunLimits, runner: "ModelRunner",
                 chunked_prefill_size: int, settle: Callable[[], None],
                 answer: Callable[[Req], None],
                 note: Callable[[OOMDiagnosis], None] = lambda diag: None) -> None:
        self.kv = kv
        self.queues = queues
        self.limits = limits
        self.runner = runner
        self.chunked_prefill_size = chunked_prefill_size
        self.settle = settle
        self.answer = answer
        self.note = note

    def launch_allowed(self, batch: "ScheduleBatch") -> bool:
        """True: launch `batch`. False: it exceeds the activation budget (the CPU's OOM); it
        was undone and its requests retried smaller or failed (`recover`)."""
        guard = self.runner.activation_guard
        if guard is None:
            return True
        try:
            guard.check(batch.forward_batch)
        except ActivationBudgetExceeded as e:
            self.recover(batch, e)
            return False
        return True

    def recover(self, batch: "ScheduleBatch", error: BaseException) -> OOMDiagnosis:
        """Undo a prepared, not launched `batch` that ran out of memory, then retry or fail
        its requests (see the module docstring). Returns the diagnosis it logged."""
        shape = batch_shape(batch)
        diag = diagnose_oom(self.runner.plan, shape, error, self.chunked_prefill_size,
                            self.limits.max_running_requests)
        logger.warning("%s", diag.message())
        self.note(diag)
        self.kv.unprepare(batch)
        # Overlap: process the batch still on the forward thread, so no launched forward
        # reads a row or slot that the recovery hands back. (Serial loop: nothing in flight.)
        self.settle()
        if shape.phase == "prefill":
            self._recover_prefill(batch, diag, error)
        else:
            self._recover_decode(batch, diag, error)
        if self.runner.device.type == "cuda":
            torch.cuda.empty_cache()
        return diag

    def _fail(self, req: Req, diag: OOMDiagnosis) -> None:
        """End a request that holds no launched work with the diagnosis as its error."""
        self.kv.hand_back(req)
        req.finish("abort", error=diag.message())
        self.answer(req)

    def _recover_prefill(self, batch: "ScheduleBatch", diag: OOMDiagnosis,
                         error: BaseException) -> None:
        extends = batch.extend_reqs
        page = self.kv.page_size
        tokens = sum(batch.forward_batch.extend_seq_lens_cpu[:len(extends)])
        fit = diag.fitting_chunk if isinstance(error, ActivationBudgetExceeded) else 0
        new_budget = self.kv.page_floor(fit if 0 < fit < tokens else tokens // 2)
        chunking = self.chunked_prefill_size > 0
        if new_budget >= max(1, page) and (chunking or len(extends) > 1):
            self.limits.max_prefill_tokens = min(self.limits.max_prefill_tokens, new_budget)
            for req in reversed(extends):  # back to the head of the queue, in their order
                self.kv.retract(req)  # its valid KV so far, for a cache hit
                self.queues.waiting.appendleft(req)
            logger.warning("prefill budget lowered to %d tokens for this run; %d requests "
                           "retried (set --chunked-prefill-size %d to start this way)",
                           new_budget, len(extends), new_budget)
            return
        for req in extends:
            self._fail(req, diag)

    def _recover_decode(self, batch: "ScheduleBatch", diag: OOMDiagnosis,
                        error: BaseException) -> None:
        queues = self.queues
        running_ids = {id(r) for r in queues.running}
        reqs = [r for r in batch.reqs if id(r) in running_ids and not r.finished]
        if not reqs:  # every one of them finished while settling: nothing left to shrink
            return
        fit = diag.fitting_batch if isinstance(error, ActivationBudgetExceeded) else 0
        keep = fit if 0 < fit < len(reqs) else len(reqs) // 2
        if keep == 0:
            # Not even one request fits: the longest (whose K/V gather is the largest) fails;
            # it is released like an abort, when the scheduler retires finished requests.
            victim = max(reqs, key=lambda r: r.seq_len)
            victim.finish("abort", error=diag.message())
            return
        # Fewest generated tokens first, as KV retraction does: the cheapest to recompute.
        victims = sorted(reqs, key=lambda r: (len(r.output_ids), -len(r.input_ids)))[:len(reqs) - keep]
        victim_ids = {id(v) for v in victims}
        queues.running = [r for r in queues.running if id(r) not in victim_ids]
        for v in reversed(victims):
            self.kv.retract(v)
            queues.waiting.appendleft(v)
        self.limits.max_running_requests = min(self.limits.max_running_requests, keep)
        logger.warning("decode batch out of activation memory: retracted %d requests; max "
                       "running requests lowered to %d for this run (set --max-running-requests "
                       "%d to start this way)", len(victims), keep, keep)
