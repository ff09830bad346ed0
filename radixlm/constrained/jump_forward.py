"""Jump-forward decoding: when a request's grammar admits exactly one continuation string,
append it at once, canonically tokenized, instead of decoding it token by token.

Invariants (the why and the timeline: docs/structured-output.md, "Jump-forward decoding"):
  * Text after a jump = text before + the forced string, the output from `start` (never
    before a sent, cached or prompt token; at most RETOKENIZE_WINDOW back) re-encoded.
  * K/V from `req.jump_from` on is stale: the request leaves `running` (via `held` while a
    launched batch holds it: that sample is dropped, its draw undone), frees its slots
    from there and waits first in the queue with its row (`awaiting_extend`): its new
    tail is an extend row of the next decode step (a MIXED batch).
  * No jump of trailing spaces, into max_new_tokens, the context or a stop string. With
    logprobs no sampled token is re-encoded and the extend recomputes the last one: the
    jumped tokens' logprobs are the model's, from their extend (`req.logprob_gap`).
Per step: one `find_jump_forward_string` per constrained row; tokenizer work only on jumps.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from collections import deque

    from radixlm.constrained.step_mask import GrammarStep
    from radixlm.scheduler.req import Req


class _RequestKV(Protocol):
    def roll_back(self, req: "Req", start: int) -> None: ...
    def retract(self, req: "Req") -> None: ...


class Scheduler(Protocol):
    """What the requeue reads and changes of the scheduler (scheduler/scheduler.py), named
    here so that constrained/ does not import the scheduler that calls it."""
    running: "list[Req]"
    waiting: "deque[Req]"
    finishing: "list[Req]"
    inflight: Any  # the launched, unprocessed batch (executor/forward_worker.py InFlight)
    outbox: list[Any]
    output_processor: Any
    kv: _RequestKV

logger = logging.getLogger(__name__)


def awaiting_extend(req: "Req") -> bool:
    """A jumped request waiting with its row, its new tail to extend (a chunked prefill
    between chunks holds a row too, but has no output yet)."""
    return req.req_pool_idx is not None and bool(req.output_ids)


def only_jumpers_wait(waiting: "deque[Req]") -> bool:
    """Every waiting request is a jumped one (they are first in the queue: O(jumpers))."""
    return all(awaiting_extend(r) for r in waiting)

# Output tokens before the forced string that are re-encoded with it (a BPE merge across
# the boundary reaches back at most a few tokens).
RETOKENIZE_WINDOW = 4


@dataclass
class JumpStats:
    jumps: int = 0
    jumped_tokens: int = 0  # tokens added without being sampled (net of re-tokenization)
    retokenized: int = 0  # jumps that changed ids already in the output

    def as_dict(self) -> dict[str, int]:
        return {"jumps": self.jumps, "jumped_tokens": self.jumped_tokens,
                "retokenized": self.retokenized}


@dataclass
class _Held:
    req: "Req"
    step: "GrammarStep | None"  # the launched batch's mask holding its generator snapshot
    row: int


@dataclass
class JumpForward:
    tokenizer: Any
    context_len: int
    stats: JumpStats = field(default_factory=JumpStats)
    # Jumped requests out of `running` whose launched batch is not processed yet.
    held: list[_Held] = field(default_factory=list)

    # --- text ----------------------------------------------------------------------

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=False,
                                     clean_up_tokenization_spaces=False)

    def _encode(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def try_jump(self, req: "Req") -> bool:
        """Append the forced continuation of `req`'s grammar to its output (caller: the
        request has a matcher and is not finished). True if it jumped; a request holding
        a row is then marked (`req.jump_from`) and must leave `running` (`after_process`)."""
        p = req.sampling_params
        m = req.grammar
        if m.is_terminated():
            return False
        out = req.output_ids
        n_in = len(req.input_ids)
        if p.logprobs and (req.req_pool_idx is None or not out
                           or n_in + len(out) - 1 < req.cached_len):
            return False  # the logits of the jumped tokens' positions must be computed
        # A trailing space is left to the model: BPE vocabularies start words with it
        # (" true", " no"), so jumping it would force a split the model never saw.
        forced = m.find_jump_forward_string().rstrip(" ")
        if not forced or "\ufffd" in forced:
            return False
        lo = len(out) if p.logprobs else max(req.sent_len, req.cached_len - n_in,
                                              len(out) - RETOKENIZE_WINDOW, 0)
        for start in dict.fromkeys((lo, len(out))):  # the window, else the forced text alone
            old_text = self._decode(out[start:]) if start < len(out) else ""
            if "\ufffd" in old_text:  # a character split across the boundary
                continue
            text = old_text + forced
            new = self._encode(text)
            if self._decode(new) == text:
                break
        else:
            return False
        limit = min(n_in + p.max_new_tokens, self.context_len)
        if n_in + start + len(new) >= limit or any(s in text for s in p.stop):
            return False
        if not m.accept_string(forced):  # cannot happen: the grammar forced it
            logger.error("request %s: grammar refused its own forced string %r", req.rid, forced)
            return False
        old = out[start:]
        same = 0
        while same < min(len(old), len(new)) and old[same] == new[same]:
            same += 1
        del out[start:]
        out.extend(new)
        self.stats.jumps += 1
        self.stats.jumped_tokens += len(new) - len(old)
        self.stats.retokenized += same < len(old)
        if p.logprobs:  # start == len(old out): recompute its last token for the logits
            req.logprob_gap = start
            req.jump_from = n_in + start - 1
        elif req.req_pool_idx is not None:
            req.jump_from = n_in + start + same
        return True

    # --- the scheduler's side -------------------------------------------------------

    def after_process(self, sched: "Scheduler") -> None:
        """After a batch's outputs were processed: jumped requests leave `running`; those no
        launched batch contains any more roll their KV back and wait at the head of the
        queue (or, aborted meanwhile, are answered and released)."""
        if any(r.jump_from is not None for r in sched.running):
            inflight = sched.inflight
            keep = []
            for r in sched.running:
                if r.jump_from is None:
                    keep.append(r)
                    continue
                step, row = None, -1
                if r.inflight and inflight is not None and inflight.grammar is not None:
                    row = next((i for i, x in enumerate(inflight.sampling_reqs) if x is r), -1)
                    step = inflight.grammar if row >= 0 else None
                self.held.append(_Held(r, step, row))
            sched.running = keep
        if not self.held:
            return
        still = []
        for h in self.held:
            if h.req.inflight:
                still.append(h)
                continue
            self._requeue(sched, h)
        self.held = still

    def _requeue(self, sched: "Scheduler", h: _Held) -> None:
        r = h.req
        if h.step is not None and r.generator is not None:
            state = h.step.generator_state(h.row)
            if state is not None:  # the dropped sample's draw never happened
                r.generator.set_state(state)
        self.rollback(sched, r)
        if r.finished:  # aborted while held
            sched.outbox.append(sched.output_processor.make_output(r))
            sched.finishing.append(r)
            return
        # It keeps its row and valid KV: its tail rides in the next decode step as an
        # extend row (scheduler._next_batch); if the pool runs short, a retraction or
        # `unblock` hands them to the radix cache.
        sched.waiting.appendleft(r)

    @staticmethod
    def unblock(sched: "Scheduler") -> None:
        """Nothing runs, nothing is in flight and admission took nothing: jumped requests
        waiting with their KV hand it to the radix cache (evictable, as after a
        retraction), so that KV they hold can never keep the queue's head from fitting."""
        for r in sched.waiting:
            if awaiting_extend(r):
                sched.kv.retract(r)

    @staticmethod
    def rollback(sched: "Scheduler", r: "Req") -> None:
        """Give back `r`'s K/V from `jump_from` on (RequestKV.roll_back); clears jump_from."""
        b, r.jump_from = r.jump_from, None
        if b is not None:
            sched.kv.roll_back(r, b)

    def held_reqs(self) -> list["Req"]:
        return [h.req for h in self.held]

    def abort(self, rid: str) -> bool:
        for h in self.held:
            if h.req.rid == rid:
                h.req.finish("abort")
                return True
        return False
