"""Keep serving when a batch would run out of memory: undo it, then retry smaller or fail.

Where it hooks in: between building a batch (`Scheduler._next_batch`: KV slots allocated
and recorded in req_to_token, `kv_len` not yet advanced) and launching it
(`Scheduler._launch`, which commits kv_len and caches prompt KV). There the batch is
checked against the activation budget (`launch_allowed`); one that does not fit is
recovered here and not launched. Before launch nothing is committed, so the undo is exact:

  1. `unprepare`: give back the fresh pages this batch took (positions from the request's
     first page boundary at or after kv_len up to kv_len + its extend length; positions in
     a partly filled last page stay with the request, which still owns that page), so every
     request is again in the state admission left it in;
  2. settle the launched batch still in flight (overlap), so no request is read by a
     running forward while its row or slots change hands;
  3. prefill (EXTEND/MIXED): the extend requests hand their (valid) KV so far to the radix
     cache and go back to the head of the queue; the scheduler's prefill budget
     (`max_prefill_tokens`, which caps each chunk) is lowered to the largest chunk that fits
     (or halved), so the retry is smaller. When it cannot get smaller (a single request
     without chunking, or under one page), the requests fail with the diagnosis as their
     error. MIXED riders stay running; they decode in the next batch.
     decode: the requests with the fewest generated tokens are retracted (KV to the cache,
     back to the queue, recomputed later from a cache hit) until the rest fit, and
     `runner.max_running_requests` is lowered to that many so they do not all come back at
     once; when not even one request fits, the longest one fails with the diagnosis.
Each recovery strictly shrinks a budget or ends a request, so retries terminate. The
budgets stay lowered for the rest of the run; the log says which flag to set instead.
The pool invariant holds throughout (the tests check it after every step).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import torch

from radixlm.executor.forward_worker import batch_shape as forward_batch_shape
from radixlm.mem.activation_guard import ActivationBudgetExceeded
from radixlm.mem.oom import BatchShape, OOMDiagnosis, diagnose_oom
from radixlm.scheduler.req import Req

if TYPE_CHECKING:
    from radixlm.scheduler.schedule_batch import ScheduleBatch
    from radixlm.scheduler.scheduler import Scheduler

logger = logging.getLogger(__name__)


def launch_allowed(sched: "Scheduler", batch: "ScheduleBatch") -> bool:
    """True: launch `batch`. False: it exceeds the activation budget (the CPU's OOM); it
    was undone and its requests retried smaller or failed (`recover_from_oom`)."""
    guard = sched.runner.activation_guard
    if guard is None:
        return True
    try:
        guard.check(batch.forward_batch)
    except ActivationBudgetExceeded as e:
        recover_from_oom(sched, batch, e)
        return False
    return True


def batch_shape(batch: "ScheduleBatch") -> BatchShape:
    return forward_batch_shape(batch.forward_batch)


def recover_from_oom(sched: "Scheduler", batch: "ScheduleBatch",
                     error: BaseException) -> OOMDiagnosis:
    """Undo a prepared, not launched `batch` that ran out of memory, then retry or fail its
    requests (see the module docstring). Returns the diagnosis it logged."""
    runner = sched.runner
    shape = batch_shape(batch)
    diag = diagnose_oom(runner.plan, shape, error, sched.chunked_prefill_size,
                        runner.max_running_requests)
    logger.warning("%s", diag.message())
    sched.dashboard.note_oom(diag.message(), diag.phase, diag.pool, diag.fixes)
    unprepare(sched, batch)
    _settle_inflight(sched)
    if shape.phase == "prefill":
        _recover_prefill(sched, batch, diag, error)
    else:
        _recover_decode(sched, batch, diag, error)
    if runner.device.type == "cuda":
        torch.cuda.empty_cache()
    return diag


def unprepare(sched: "Scheduler", batch: "ScheduleBatch") -> None:
    """Free the fresh pages `prepare_for_extend/decode` took for `batch`. Request b
    computed positions [kv_len, kv_len + n_b); those from ceil(kv_len / page) * page on lie
    in fresh pages, whose first slots are among them (`allocator.free` frees a page by its
    first slot)."""
    fb = batch.forward_batch
    alloc = sched.runner.allocator
    table = sched.runner.req_to_token_pool.req_to_token
    page = alloc.page_size
    lens = fb.extend_seq_lens_cpu if fb.extend_seq_lens_cpu is not None else [1] * fb.batch_size
    for req, n in zip(batch.reqs, lens):
        start = -(-req.kv_len // page) * page
        end = req.kv_len + n
        if end > start:
            alloc.free(table[req.req_pool_idx, start:end].to(torch.int64))


def _settle_inflight(sched: "Scheduler") -> None:
    """Overlap: process the batch still on the forward thread, so no launched forward reads
    a row or slot that the recovery hands back. (Serial loop: nothing in flight.)"""
    sched.finish_inflight()


def _fail(sched: "Scheduler", req: Req, diag: OOMDiagnosis) -> None:
    """End a request that holds no launched work with the diagnosis as its error."""
    sched.tree_cache.cache_finished_req(req)
    req.finish("abort", error=diag.message())
    sched.outbox.append(sched.output_processor.make_output(req))


def _recover_prefill(sched: "Scheduler", batch: "ScheduleBatch", diag: OOMDiagnosis,
                     error: BaseException) -> None:
    extends = batch.extend_reqs
    page = sched.runner.allocator.page_size
    tokens = sum(batch.forward_batch.extend_seq_lens_cpu[:len(extends)])
    fit = diag.fitting_chunk if isinstance(error, ActivationBudgetExceeded) else 0
    new_budget = fit if 0 < fit < tokens else tokens // 2
    new_budget = new_budget // page * page
    chunking = sched.chunked_prefill_size > 0
    if new_budget >= max(1, page) and (chunking or len(extends) > 1):
        sched.max_prefill_tokens = min(sched.max_prefill_tokens, new_budget)
        for req in reversed(extends):  # back to the head of the queue, in their order
            sched.tree_cache.cache_finished_req(req)  # its valid KV so far, for a cache hit
            req.retractions += 1
            sched.waiting.appendleft(req)
        logger.warning("prefill budget lowered to %d tokens for this run; %d requests retried "
                       "(set --chunked-prefill-size %d to start this way)", new_budget,
                       len(extends), new_budget)
        return
    for req in extends:
        _fail(sched, req, diag)


def _recover_decode(sched: "Scheduler", batch: "ScheduleBatch", diag: OOMDiagnosis,
                    error: BaseException) -> None:
    running_ids = {id(r) for r in sched.running}
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
    sched.running = [r for r in sched.running if id(r) not in victim_ids]
    for v in reversed(victims):
        sched.tree_cache.cache_finished_req(v)
        v.retractions += 1
        sched.waiting.appendleft(v)
    runner = sched.runner
    runner.max_running_requests = min(runner.max_running_requests, keep)
    logger.warning("decode batch out of activation memory: retracted %d requests; max "
                   "running requests lowered to %d for this run (set --max-running-requests "
                   "%d to start this way)", len(victims), keep, keep)
