"""Scheduler: continuous batching over one ModelRunner.

One `step()` = pick the next batch (admit waiting requests as an EXTEND batch if the
PrefillAdder allows, else DECODE every running request), launch it on the forward worker,
and process the results of a batch. Requests join and leave between steps.

Overlap (zero-overhead) scheduling, the default: a step launches batch N+1 and then
processes batch N while N+1 runs on the forward thread (`executor/forward_worker.py`), so
the device never waits for the scheduler's CPU work. `--disable-overlap-schedule` runs the
serial loop: a step processes the batch it just launched. Both loops are this one `step()`
over the same helpers (`_next_batch`, `_launch`, `_process`); only which batch is
processed differs.

More: docs/scheduler.md, "scheduler/scheduler.py".
"""

from __future__ import annotations

import logging
import random
import time
from collections import deque
from dataclasses import dataclass

import torch

from radixlm.constrained.jump_forward import JumpForward, only_jumpers_wait
from radixlm.constrained.scheduler_hooks import CONSTRAINT_ERROR_STATUS, ConstrainedDecoding
from radixlm.constrained.step_mask import GrammarStep
from radixlm.forward_batch import ForwardMode
from radixlm.executor.forward_worker import ForwardTask, ForwardWorker, InFlight
from radixlm.executor.model_runner import ModelRunner
from radixlm.runtime.host_malloc import release_free_heap
from radixlm.mem import PoolInvariantError
from radixlm.mem.hi_radix_cache import HiCacheConfig, HiRadixCache, LoadDeferred
from radixlm.mem.radix_cache import RadixCache
from radixlm.messages import (AbortReq, FlushCacheResult, PoolStats, ReqTokenOut,
                              TokenizedGenerateReq)
from radixlm.scheduler.dashboard_probe import DashboardProbe
from radixlm.scheduler.oom_recovery import OOMRecovery
from radixlm.scheduler.output_processor import OutputProcessor
from radixlm.scheduler.prompt_logprobs import (cache_match_len, deliver_prompt_logprobs,
                                               needs_prompt_logprobs, plan_prompt_logprobs)
from radixlm.scheduler.policy import InBatchPrefixSharing, make_policy
from radixlm.scheduler.prefill_adder import PrefillAdder
from radixlm.scheduler.queues import Queues, RunLimits
from radixlm.scheduler.request_kv import RequestKV
from radixlm.scheduler.request_oom import fail_oom_requests
from radixlm.scheduler.req import Req
from radixlm.scheduler.schedule_batch import OutOfKVSlots, ScheduleBatch
from radixlm.speculative.controller import SpecConfig

logger = logging.getLogger(__name__)

# Steps for the new-token ratio to decay from its initial value to its minimum when
# --new-token-ratio-decay is not given (SGLang's default_new_token_ratio_decay_steps).
NEW_TOKEN_RATIO_DECAY_STEPS = 600

# Outcomes of offering one waiting request to an admission round (LOADING: its prefix
# continues in the hicache's storage tier and is being loaded; it waits there).
ADMITTED, DEFERRED, REFUSED, LOADING = "admitted", "deferred", "refused", "loading"


@dataclass
class LaunchedBatch:
    """A batch handed to the forward worker whose results are not processed yet."""
    batch: ScheduleBatch
    sampling_reqs: list[Req]  # the requests that sample a token in it, in logits order
    handle: InFlight  # the forward worker's: its future and its stream events
    grammar: GrammarStep | None = None  # constrained rows' bitmask, filled by step()


class Scheduler:
    def __init__(self, runner: ModelRunner, tokenizer, eos_token_ids: list[int],
                 max_prefill_tokens: int, random_seed: int = 0,
                 disable_radix_cache: bool = False, chunked_prefill_size: int = -1,
                 schedule_policy: str = "fcfs", init_new_token_ratio: float = 0.7,
                 min_new_token_ratio: float = 0.1,
                 new_token_ratio_decay: float | None = None,
                 enable_mixed_chunk: bool = False, overlap: bool = True,
                 grammar_compile_timeout: float = 30.0, grammar_synchronous: bool = False,
                 disable_jump_forward: bool = False,
                 speculative: SpecConfig | None = None,
                 hicache: HiCacheConfig | None = None, stream_interval: int = 1) -> None:
        if not 0.0 < min_new_token_ratio <= init_new_token_ratio <= 1.0:
            raise ValueError(
                f"need 0 < min_new_token_ratio ({min_new_token_ratio}) <= init_new_token_ratio "
                f"({init_new_token_ratio}) <= 1")
        if new_token_ratio_decay is None:
            new_token_ratio_decay = ((init_new_token_ratio - min_new_token_ratio)
                                     / NEW_TOKEN_RATIO_DECAY_STEPS)
        if new_token_ratio_decay < 0:
            raise ValueError(f"new_token_ratio_decay must be >= 0, got {new_token_ratio_decay}")
        self.policy = make_policy(schedule_policy)
        self.init_new_token_ratio = init_new_token_ratio
        self.min_new_token_ratio = min_new_token_ratio
        self.new_token_ratio_decay = new_token_ratio_decay
        self.new_token_ratio = init_new_token_ratio
        # Batches ran since the free heap was last released (`on_idle`).
        self.heap_dirty = False
        self.runner = runner
        self.pools = pools = runner.pools  # shared with the runner (mem/pools.py)
        self.page_size = pools.allocator.page_size
        # The prefix cache; with the hierarchical cache, over host and storage tiers too.
        self.tree_cache = (RadixCache(pools.req_to_token_pool, pools.allocator,
                                      page_size=self.page_size, disable=disable_radix_cache)
                           if hicache is None else
                           HiRadixCache(pools.req_to_token_pool, pools.allocator,
                                        pools.token_to_kv_pool, self.page_size, hicache))
        self.kv = RequestKV(pools.req_to_token_pool, pools.allocator, self.tree_cache)
        self.enable_mixed_chunk = enable_mixed_chunk
        self.eos_token_ids = frozenset(eos_token_ids)
        self.limits = RunLimits(max_prefill_tokens, runner.max_running_requests)
        self.chunked_prefill_size = chunked_prefill_size  # <= 0: no chunking
        self.last_step_was_chunk = False
        self.rng = random.Random(random_seed)
        self.queues = Queues()
        self.outbox: list[ReqTokenOut] = []
        # Jump-forward decoding of constrained requests (constrained/jump_forward.py).
        self.jump_forward = None if disable_jump_forward else JumpForward(tokenizer,
                                                                          self.context_len)
        self.output_processor = OutputProcessor(tokenizer, runner.context_len, runner.vocab_size,
                                                runner.device, self.jump_forward,
                                                stream_interval)
        # Overlap: batch N+1 is launched before batch N's results are processed.
        self.overlap = overlap
        self.worker = ForwardWorker(runner, inline=not overlap)
        self.inflight: LaunchedBatch | None = None  # overlap: launched, not yet processed
        self.num_retractions = 0
        # Prompt tokens of requests at their first admission, and how many of them were
        # served from the radix cache (the cache hit rate in PoolStats).
        self.prompt_tokens_total = 0
        self.cached_tokens_total = 0
        # Structured output (radixlm/constrained/): constrained requests wait in its
        # grammar queue until compiled; nothing is built before the first one.
        self.constrained = ConstrainedDecoding(tokenizer, runner.vocab_size, sorted(self.eos_token_ids),
                                               grammar_compile_timeout,
                                               synchronous=grammar_synchronous)
        self.constrained.snapshot_generators = overlap and self.jump_forward is not None
        # Speculative decoding (radixlm/speculative/): a verify step replaces a decode step.
        self.speculative = (None if speculative is None
                            else speculative.build(self.tree_cache, runner, tokenizer))
        # GET /dashboard's step history and snapshots; records only while a page watches.
        self.dashboard = DashboardProbe()
        self.oom = OOMRecovery(self.kv, self.queues, self.limits, runner, chunked_prefill_size,
                               settle=self.finish_inflight, answer=self._answer,
                               note=lambda d: self.dashboard.note_oom(d.message(), d.phase,
                                                                      d.pool, d.fixes))

    # --- queues and limits (scheduler/queues.py) ----------------------------------

    @property
    def waiting(self) -> deque[Req]:
        return self.queues.waiting

    @waiting.setter
    def waiting(self, value: deque[Req]) -> None:
        self.queues.waiting = value

    @property
    def running(self) -> list[Req]:
        return self.queues.running

    @running.setter
    def running(self, value: list[Req]) -> None:
        self.queues.running = value

    @property
    def finishing(self) -> list[Req]:
        """Finished (or aborted) requests already answered whose row and slots wait for
        the launched batch that still contains them (`Req.inflight`) to complete."""
        return self.queues.finishing

    @finishing.setter
    def finishing(self, value: list[Req]) -> None:
        self.queues.finishing = value

    @property
    def max_prefill_tokens(self) -> int:
        return self.limits.max_prefill_tokens

    @property
    def max_running_requests(self) -> int:
        return self.limits.max_running_requests

    def _answer(self, req: Req) -> None:
        self.outbox.append(self.output_processor.make_output(req))

    # --- limits the API process must know ---------------------------------------

    @property
    def context_len(self) -> int:
        """Longest request (prompt + output) this instance can ever hold."""
        return min(self.runner.context_len, self.runner.max_total_tokens)

    # --- input -------------------------------------------------------------------

    def add_request(self, msg: TokenizedGenerateReq) -> None:
        p = msg.sampling_params
        req = Req(rid=msg.rid, input_ids=list(msg.input_ids), sampling_params=p, stream=msg.stream,
                  eos_token_ids=self.eos_token_ids)
        if not req.input_ids:
            req.finish("abort", error="the prompt is empty")
        elif len(req.input_ids) + p.max_new_tokens > self.context_len:
            req.finish("abort", error=(
                f"the request needs {len(req.input_ids)} prompt + {p.max_new_tokens} output "
                f"tokens but this instance holds at most {self.context_len} per request"))
        elif p.max_new_tokens == 0 and p.prompt_logprobs is None:
            req.finish("length")  # (with prompt_logprobs: the prefill runs, see process)
        if req.finished:
            self.outbox.append(self.output_processor.make_output(req))
            return
        if not p.is_greedy:
            req.generator = torch.Generator(self.runner.device)
            req.generator.manual_seed(p.seed if p.seed is not None else self.rng.getrandbits(63))
        self.output_processor.init_penalty_state(req)
        if p.constraint is not None:
            self.constrained.add(req)  # joins `waiting` once its grammar is compiled
            return
        self.waiting.append(req)

    def _admit_compiled(self) -> None:
        """Constrained requests whose grammar is ready join the waiting queue; those whose
        grammar failed or timed out are answered with a 400."""
        for outcome in self.constrained.ready():
            req = outcome.req
            if outcome.error is None:
                if self.jump_forward is not None:  # a forced opening joins the prefill
                    self.jump_forward.try_jump(req)
                self.waiting.append(req)
            else:
                req.finish("abort", error=outcome.error, error_status=CONSTRAINT_ERROR_STATUS)
                self.outbox.append(self.output_processor.make_output(req))

    def abort_request(self, msg: AbortReq) -> None:
        if self.tree_cache.abort_loading(msg.rid):
            return  # answered when its load completes
        queued = self.constrained.abort(msg.rid)
        if queued is not None:  # still compiling its grammar: holds nothing
            queued.finish("abort")
            self.outbox.append(self.output_processor.make_output(queued))
            return
        for req in self.waiting:
            if req.rid == msg.rid:
                self.waiting.remove(req)
                self.tree_cache.release_hold(req)  # a loaded prefix waiting for admission
                req.finish("abort")
                self.outbox.append(self.output_processor.make_output(req))
                self.finishing.append(req)  # a chunked prefill holds KV: released below
                self._release_done()
                return
        for req in self.running:
            if req.rid == msg.rid:
                # Freed by the next step's result processing, like any finished request.
                req.finish("abort")
                return
        if self.jump_forward is not None:
            self.jump_forward.abort(msg.rid)  # answered once its launched batch is done

    def handle(self, msg: object) -> None:
        if isinstance(msg, TokenizedGenerateReq):
            self.add_request(msg)
        elif isinstance(msg, AbortReq):
            self.abort_request(msg)
        else:
            logger.warning("scheduler ignores unknown message %r", type(msg).__name__)

    # --- the step ------------------------------------------------------------------

    def has_work(self) -> bool:
        return bool(self.waiting or self.running or self.inflight or self.finishing
                    or self.constrained.num_queued or self._jump_held()
                    or self.tree_cache.num_loading)

    def step(self) -> list[ReqTokenOut]:
        """Build and launch the next batch, process the results of the previous one (overlap)
        or of this one (serial); return the outputs to send."""
        t0, blocked0 = time.perf_counter(), self.worker.blocked_s
        self._retire_finished()
        if self.tree_cache.num_loading:
            self._poll_loads()
        if self.constrained.num_queued:
            if not (self.waiting or self.running or self.inflight):
                self.constrained.wait(0.05)  # only grammars compiling: do not spin
            self._admit_compiled()
        batch = self._next_batch()
        if batch is not None and not self.oom.launch_allowed(batch):
            batch = None  # over the activation budget: undone, retried smaller or failed
        launched = self._launch(batch) if batch is not None else None
        if self.overlap:
            # Batch N+1 is on the forward thread: process batch N meanwhile.
            done, self.inflight = self.inflight, launched
        else:
            done = launched
        try:
            if done is not None:
                self._process(done)
        finally:
            if launched is not None and launched.grammar is not None:
                launched.grammar.fill()  # overlap: while its forward runs (no-op if serial)
        self._retire_finished()
        if not self.has_work():
            self.new_token_ratio = self.init_new_token_ratio  # a fresh start, as in SGLang
            self.worker.timer.mark_idle()
            try:
                self.check_invariant()
            except PoolInvariantError as e:  # a bug: report it, keep serving
                logger.error("pool invariant violated while idle: %s", e)
        # Scheduling CPU time of this step: everything but running / waiting for forwards.
        sched_s = time.perf_counter() - t0 - (self.worker.blocked_s - blocked0)
        self.worker.timer.schedule_s += sched_s
        if self.dashboard.watching:
            self.dashboard.record_step(self, batch, t0, sched_s)
        out, self.outbox = self.outbox, []
        return out

    def _poll_loads(self) -> None:
        """Requests whose prefix the hicache loaded back go to the head of the queue, behind
        chunked prefills in progress (which must finish first); an aborted one is answered.
        With nothing else to do, wait a little for one."""
        idle = not (self.waiting or self.running or self.inflight)
        at = next((i for i, r in enumerate(self.waiting) if r.req_pool_idx is None),
                  len(self.waiting))
        for req in reversed(self.tree_cache.poll_loads(timeout=0.01 if idle else 0.0)):
            if req.finished:
                self._answer(req)
            else:
                self.waiting.insert(at, req)

    def _retire_finished(self) -> None:
        """Running requests found finished (or aborted) leave `running` and get their last
        output now; their KV goes back once no launched batch still contains them."""
        if any(r.finished for r in self.running):
            keep = []
            for req in self.running:
                if req.finished:
                    self.outbox.append(self.output_processor.make_output(req))
                    self.finishing.append(req)
                else:
                    keep.append(req)
            self.running = keep
        self._release_done()

    def _release_done(self) -> None:
        """Hand the KV of finished requests that no launched batch reads any more to the
        cache (their row too)."""
        if self.finishing:
            still = []
            for req in self.finishing:
                if req.inflight:
                    still.append(req)
                else:
                    self.kv.release(req)  # to the cache (minus what a failed forward wrote)
            self.finishing = still

    def _next_batch(self) -> ScheduleBatch | None:
        """The next batch, its KV slots allocated and its ForwardBatch built; None if idle."""
        pools = self.pools
        if self.last_step_was_chunk and self.running and not self.enable_mixed_chunk:
            self.last_step_was_chunk = False  # let running decodes through between chunks
            return self._decode_batch()
        chunk = self.chunked_prefill_size
        # Jumped requests' new tails (constrained/jump_forward.py) ride in the decode step
        # (a new prompt waiting: they join its extend, as before).
        jumpers_only = (not self.enable_mixed_chunk and bool(self.running and self.waiting)
                        and only_jumpers_wait(self.waiting))
        mixed = bool(self.running) and (self.enable_mixed_chunk or jumpers_only)
        # Evictable cache slots count as free: allocation evicts them on demand.
        adder = PrefillAdder(free_kv_slots=pools.allocator.available_size()
                             + self.tree_cache.evictable_size(),
                             free_rows=min(pools.req_to_token_pool.available_size(),
                                           self.limits.max_running_requests - len(self.running)),
                             prefill_budget=min(self.max_prefill_tokens, chunk) if chunk > 0
                             else self.max_prefill_tokens,
                             chunking=chunk > 0, running=self.running,
                             new_token_ratio=self.new_token_ratio, page_size=self.page_size,
                             mixed_with_running=mixed)
        if self.waiting and adder.free_rows > 0:
            self.policy.calc_priority(self.waiting, self.tree_cache)
        sharing = InBatchPrefixSharing(enabled=not self.tree_cache.disable)
        unsettled = None
        if self.waiting:  # overlap: K/V of a forward not known to succeed is not matched
            loc = self.inflight.batch.forward_batch.out_cache_loc if self.inflight else None
            unsettled = self.kv.unsettled_slots(loc, self.finishing)
        deferred: list[Req] = []
        while self.waiting:
            outcome = self._try_admit(self.waiting[0], adder, sharing, unsettled)
            if outcome == REFUSED:
                if not (adder.admitted or self.running or self.inflight or self.finishing):
                    # Nothing will give KV back: loaded prefixes locked for their requests'
                    # admission would block the queue for ever. Unlock them (evictable).
                    self.tree_cache.release_holds()
                break
            req = self.waiting.popleft()  # LOADING: it waits in the hicache
            if outcome == DEFERRED:
                deferred.append(req)
        self.waiting.extendleft(reversed(deferred))  # back in front, in their order
        if adder.admitted:
            if mixed:
                # The running requests decode inside this extend batch, after the prefills.
                batch = self._batch([*adder.admitted, *self.running], ForwardMode.MIXED,
                                    num_mixed_decodes=len(self.running))
            else:
                batch = self._batch(adder.admitted, ForwardMode.EXTEND)
            batch.prepare_for_extend()  # the adder's KV budget guarantees the slots
            return batch
        if self.running:
            if self.speculative is not None and self.speculative.run_step(self):
                return None  # a verify step ran and was processed in place of a decode
            return self._decode_batch()
        if self.speculative is not None:
            self.speculative.forget_gone([])  # nothing decodes: a draft model's KV goes back
        if self.jump_forward is not None and self.inflight is None:
            self.jump_forward.unblock(self)
        return None

    def _try_admit(self, req: Req, adder: PrefillAdder, sharing: InBatchPrefixSharing,
                   unsettled: torch.Tensor | None = None) -> str:
        """Match `req`'s longest cached prefix, lock it, and admit the request if the
        budgets allow; on admission it gets a req_to_token row whose first prefix_len
        positions are the cache's slots. Returns ADMITTED, DEFERRED (a request admitted
        earlier in this round computes enough of its prefix: try again next round) or
        REFUSED (the budgets are exhausted: end the round). Unless admitted, nothing is
        left locked or held. A match containing `unsettled` slots (K/V of a forward not
        known to succeed, `RequestKV.unsettled_slots`) is DEFERRED too."""
        if req.req_pool_idx is not None:  # a chunked prefill continuing: row and lock held
            if not adder.try_add(req):
                return REFUSED
            sharing.record(req)
            return ADMITTED
        cache = self.tree_cache
        # At least the last token must be computed: its logits give the next token.
        # Prompt logprobs need the logits of every prompt position from the request's
        # logprob_start_len on: no cached prefix past it.
        skip = needs_prompt_logprobs(req)
        match = cache.match_prefix(req.fill_ids[:cache_match_len(req)])
        if self.kv.reads_unsettled(match.device_indices, unsettled):
            return DEFERRED
        if not skip:
            try:
                delta = cache.start_load(req, req.fill_ids[:req.seq_len - 1], match,
                                         adder.kv_budget)
            except LoadDeferred:
                return DEFERRED
            if delta is not None:
                adder.kv_budget += delta  # its locked prefix and the slots it loads into
                return LOADING
        if not skip and sharing.should_defer(req, match.prefix_len):
            return DEFERRED
        locked = not cache.disable
        if locked:
            # Locked slots are no longer evictable, so no longer in the KV budget.
            adder.kv_budget += cache.inc_lock_ref(match.last_node)
        req.kv_len = match.prefix_len
        if not adder.try_add(req):
            req.kv_len = 0
            if locked:
                adder.kv_budget += cache.dec_lock_ref(match.last_node)
            return REFUSED
        self.kv.admit(req, match, locked)
        adder.kv_budget += cache.release_hold(req)  # its own lock now keeps a loaded prefix
        if req.retractions == 0:  # first admission: the usage and the hit-rate statistics
            req.cached_tokens = match.prefix_len
            self.prompt_tokens_total += len(req.input_ids)
            self.cached_tokens_total += match.prefix_len
        sharing.record(req)
        return ADMITTED

    def _batch(self, reqs: list[Req], mode: ForwardMode,
               num_mixed_decodes: int = 0) -> ScheduleBatch:
        p = self.pools
        return ScheduleBatch(reqs, mode, p.req_to_token_pool, p.token_to_kv_pool, p.allocator,
                             self.runner.device, self.tree_cache, num_mixed_decodes=num_mixed_decodes)

    def _decode_batch(self) -> ScheduleBatch | None:
        """Decode every running request. When KV slots run out: first finish the launched
        batch (overlap), whose finished requests may give slots back; then release a
        chunked prefill waiting between chunks; then retract requests (fewest generated
        tokens first) back to the head of the queue, their KV handed to the cache, until
        the rest fit. Retraction thus only ever happens with nothing in flight, exactly
        as in the serial loop. None when every running request was found finished."""
        retractions = self.num_retractions
        while True:
            batch = self._batch(list(self.running), ForwardMode.DECODE)
            if not batch.reqs:
                return None
            try:
                batch.prepare_for_decode()
                break
            except OutOfKVSlots:
                if self.inflight is not None:
                    self.finish_inflight()
                    continue
                if self.tree_cache.release_holds():  # waiting loaded prefixes go first
                    continue
                self._retract_one(batch)
        if self.num_retractions == retractions:  # went well: admit a little more boldly
            self.new_token_ratio = max(self.new_token_ratio - self.new_token_ratio_decay,
                                       self.min_new_token_ratio)
        return batch

    def _retract_one(self, batch: ScheduleBatch) -> None:
        """Free KV for a decode that does not fit (nothing is in flight here)."""
        # Out of slots: the ratio was too optimistic. Back to the initial value (a simpler
        # rule than SGLang's estimate from the retracted batch).
        self.new_token_ratio = self.init_new_token_ratio
        partial = next((r for r in self.waiting if r.req_pool_idx is not None), None)
        if partial is not None:
            self.kv.retract(partial)  # restarts from a cache hit
            self.num_retractions += 1
            return
        if len(batch.reqs) <= 1:
            # Cannot happen: add_request rejects requests larger than the pool.
            raise OutOfKVSlots("a lone request does not fit the KV pool")
        victim = min(batch.reqs, key=lambda r: (len(r.output_ids), -len(r.input_ids)))
        self.running.remove(victim)
        # Its KV goes to the cache, so re-admission is a cheap prefix hit.
        self.kv.retract(victim)
        self.num_retractions += 1
        self.waiting.appendleft(victim)
        logger.info("retracted %s (%d output tokens) to free KV slots", victim.rid,
                    len(victim.output_ids))

    def on_idle(self) -> None:
        """The loop found nothing to do for a whole poll period (about a second): if
        batches ran since the last time, give the allocator's free heap back to the OS
        (the activations of those forwards; host_malloc.release_free_heap), once."""
        if self.heap_dirty and not self.has_work():
            self.heap_dirty = False
            release_free_heap()

    def _launch(self, batch: ScheduleBatch) -> LaunchedBatch:
        """Hand `batch` to the forward worker and do at once every bookkeeping step that
        does not depend on its sampled tokens. Mutates: kv_len (`commit_kv`), the radix
        cache (the extends' prompt KV), `running` / `waiting` (finished prefills join
        running, unfinished chunks go back to the head of the queue)."""
        self.heap_dirty = True
        batch.commit_kv()
        if batch.forward_mode.is_extend():  # EXTEND, or MIXED (prefills + running decodes)
            extends = batch.extend_reqs
            # Every prompt KV this batch computes goes into the cache now, not when the
            # request finishes: later requests (e.g. deferred by in-batch sharing) reuse it
            # at once. It is done before the forward starts: duplicates found here are
            # positions only this batch computes, so no running forward sees its row change.
            for r in extends:
                self.kv.commit(r)
            chunked = [r for r in extends if r.kv_len < r.seq_len]
            for r in reversed(chunked):  # mid-prompt: wait at the head for the next chunk
                self.waiting.appendleft(r)
            self.last_step_was_chunk = bool(chunked)
            self.running.extend(r for r in extends if r.kv_len == r.seq_len)
        # Who samples: every request whose K/V now covers all its tokens (a finished prompt,
        # a decode, a mixed decode); kv_len counts the tokens still being sampled too.
        keep = [i for i, r in enumerate(batch.reqs) if r.kv_len == r.seq_len + r.pending_samples]
        sampling = [batch.reqs[i] for i in keep]
        for r in batch.reqs:
            r.inflight += 1
        for r in sampling:
            r.pending_samples += 1
        # Host tensors, like the batch's: the worker puts them on the device (cuda_streams).
        grammar = self.constrained.step_for(sampling) if self.constrained.active else None
        if grammar is not None and not self.overlap:
            grammar.fill()  # serial: every earlier token is accepted already
        task = ForwardTask(
            forward_batch=batch.forward_batch, sampling_reqs=sampling,
            keep=None if len(keep) == len(batch.reqs) else torch.tensor(keep, dtype=torch.int64),
            rows=torch.tensor([r.req_pool_idx for r in sampling], dtype=torch.int64),
            positions=[batch.forward_batch.seq_lens_cpu[i] for i in keep], grammar=grammar,
            prompt_logprobs=(plan_prompt_logprobs(batch.extend_reqs, batch.forward_batch)
                             if batch.forward_mode.is_extend() else None))
        return LaunchedBatch(batch, sampling, self.worker.launch(task), grammar)

    def _process(self, done: LaunchedBatch) -> None:
        """Wait for a launched batch and process its sampled tokens (append, stop checks,
        streaming)."""
        sampled = self.worker.wait(done.handle)
        if sampled is not None and sampled.failed:
            fail_oom_requests(done.batch, sampled.failed, self.kv, self.queues, self._answer,
                              self.dashboard.note_oom)
        for r in done.batch.reqs:
            r.inflight -= 1
        for r in done.sampling_reqs:
            r.pending_samples -= 1
        if sampled is not None and sampled.prompt_logprobs is not None:
            deliver_prompt_logprobs(done.batch.reqs, sampled.prompt_logprobs)
        if sampled is not None:
            self.outbox.extend(self.output_processor.process(done.sampling_reqs, sampled))
        if self.jump_forward is not None:
            self.jump_forward.after_process(self)  # jumped requests back to the queue

    def finish_inflight(self) -> None:
        """Wait for the launched batch (overlap), process its results and release what
        its finished requests hold; their outputs stay in the outbox for this step."""
        if self.inflight is not None:
            done, self.inflight = self.inflight, None
            self._process(done)
            self._retire_finished()

    def _settle(self) -> None:
        """If only a launched batch of answered requests is left, finish it."""
        if self.only_settling():
            self.finish_inflight()

    def only_settling(self) -> bool:
        """Nothing runs or waits, but a launched batch (overlap: holding only requests
        already answered) is still to be processed; one more step() settles it."""
        return not self.running and not self.waiting and self.inflight is not None

    def shutdown(self) -> None:
        """Stop the forward thread (overlap); the scheduler is unusable afterwards."""
        self.worker.shutdown()
        self.constrained.shutdown()
        self.tree_cache.close()  # the hicache's queued writes reach the disk first

    # --- invariant -------------------------------------------------------------------

    def _jump_held(self) -> list[Req]:
        return self.jump_forward.held_reqs() if self.jump_forward is not None else []

    def held_by_requests(self) -> int:
        """KV slots owned by requests (a partly filled last page counts whole)."""
        return self.kv.held_by([*self.queues.holders(), *self._jump_held()])

    def check_invariant(self) -> None:
        """Raise PoolInvariantError if a KV slot or a req_to_token row leaked."""
        self.kv.check([*self.queues.holders(), *self._jump_held()])

    def flush_cache(self, rid: str = "", storage: bool = False) -> FlushCacheResult:
        """Empty the radix cache (all its slots back to the allocator); `storage`: the
        hicache's storage tier too. Refused while any request is running or waiting,
        since they hold (locked) cache nodes."""
        self._settle()
        if self.has_work():
            return FlushCacheResult(rid, False, (
                f"cannot flush the cache while {len(self.running)} requests are running and "
                f"{len(self.waiting)} waiting; retry when the server is idle"))
        freed = self.tree_cache.total_size()
        self.tree_cache.reset()
        blocks = self.tree_cache.clear_storage() if storage else None
        if blocks is not None:
            return FlushCacheResult(rid, True, f"flushed {freed} cached tokens and "
                                    f"{blocks} stored blocks")
        return FlushCacheResult(rid, True, f"flushed {freed} cached tokens")

    @property
    def cache_hit_rate(self) -> float:
        """Cached / prompt tokens over all first admissions; 0.0 before any."""
        if self.prompt_tokens_total == 0:
            return 0.0
        return self.cached_tokens_total / self.prompt_tokens_total

    def pool_stats(self, rid: str) -> PoolStats:
        self._settle()  # idle means idle: no answered request still holding slots
        try:
            self.check_invariant()
            error = None
        except PoolInvariantError as e:
            error = str(e)
        p = self.pools
        return PoolStats(rid=rid, total_kv_slots=p.allocator.size,
                         free_kv_slots=p.allocator.available_size(),
                         held_by_requests=self.held_by_requests(),
                         held_by_cache=self.tree_cache.total_size(), running=len(self.running),
                         waiting=len(self.waiting),
                         free_req_rows=p.req_to_token_pool.available_size(),
                         invariant_error=error, page_size=self.page_size,
                         prompt_tokens_total=self.prompt_tokens_total,
                         cached_tokens_total=self.cached_tokens_total,
                         cache_hit_rate=self.cache_hit_rate,
                         step_timing=self.worker.timer.as_dict(), overlap=self.overlap,
                         grammar=None if (g := self.constrained.stats) is None else {
                             **g.as_dict(), **(self.jump_forward.stats.as_dict()
                                               if self.jump_forward is not None else {})},
                         speculative=(None if self.speculative is None
                                      else self.speculative.stats.as_dict()),
                         hicache=self.tree_cache.tier_stats(),
                         decode_graphs=(None if (d := self.runner.decode_graphs) is None
                                        else d.stats()))
