"""SpeculativeDecoding: the scheduler's hook that replaces a decode step by a verify step.

`run_step(sched)` runs where the scheduler would build a DECODE batch: only when every
running request can ride (no penalty or jumped tail; grammars check drafts), at most `max_batch_size`
decode, and some request has a draft. Lookup drafts are first proposed from the known
(under overlap lagged) state; only then is the launched batch finished and the drafts
re-proposed exactly; a `costly` drafter (draft model) proposes once, after finishing it.
Point-mass drafts: accepted = longest prefix with d_{j+1} == t_j (the target's argmax or
own draw: exact), then t_m. Drafts with a law q: rejection.py's min(1, p/q) rule against
the target's law from the verify's logits. Tokens pass the stop checks one by one; then
kv_len rolls back to seq_len - 1 (rejected slots free at once). `forget_gone` drops the
state (and draft KV) of requests that left the running set. Adaptive per request
(adaptive.py: an acceptance-rate EMA switches drafting off with probes, k shrinks on misses
and grows on full acceptance); drafts are cut to the model's cheap row count
(verify_rows.py). More: docs/speculative.md.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from radixlm.constrained.scheduler_hooks import ConstrainedDecoding
from radixlm.executor.forward_worker import ForwardTask
from radixlm.forward_batch import ForwardMode
from radixlm.scheduler.request_oom import fail_oom_requests
from radixlm.scheduler.schedule_batch import OutOfKVSlots
from radixlm.executor.sampler import Sampler, SamplingBatchInfo
from radixlm.messages import TokenLogprob
from radixlm.speculative.adaptive import AdaptiveDraft
from radixlm.speculative.drafter import Draft, Drafter
from radixlm.speculative.factory import make_drafter
from radixlm.speculative.grammar_drafts import GrammarDrafts
from radixlm.speculative.rejection import accept_with_probs
from radixlm.speculative.stats import SpecStats
from radixlm.speculative.verify_batch import prepare_verify
from radixlm.speculative.verify_rows import cap_draft_budgets, cheap_verify_rows

if TYPE_CHECKING:
    from radixlm.mem.radix_cache import RadixCache
    from radixlm.scheduler.req import Req

# The Scheduler (scheduler/scheduler.py, which imports this module): its running queue,
# inflight batch, worker, kv (RequestKV), queues, output_processor, outbox, _batch, _answer,
# finish_inflight, context_len and dashboard are what a verify step uses.
Scheduler = Any

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class SpecConfig:
    """The --speculative-* flags a scheduler needs; `from_args` is None when off."""
    algorithm: str
    num_draft_tokens: int = 4
    ngram_min: int = 2
    ngram_max: int = 5
    max_batch_size: int = 3
    draft_model_path: str | None = None

    @classmethod
    def from_args(cls, args) -> "SpecConfig | None":
        """None without --speculative-algorithm, and under
        --enable-deterministic-inference (speculation is turned off there: a verify
        forward's extend rows would not be bit-identical to decode steps)."""
        if args.speculative_algorithm is None:
            if args.speculative_draft_model_path is not None:
                raise ValueError("--speculative-draft-model-path needs "
                                 "--speculative-algorithm STANDALONE")
            return None
        standalone = args.speculative_algorithm.upper() == "STANDALONE"
        if standalone != (args.speculative_draft_model_path is not None):
            raise ValueError("--speculative-algorithm STANDALONE and "
                             "--speculative-draft-model-path go together (got "
                             f"{args.speculative_algorithm} and "
                             f"{args.speculative_draft_model_path})")
        if args.enable_deterministic_inference:
            logger.warning("--enable-deterministic-inference: speculative decoding is off")
            return None
        k = args.speculative_num_draft_tokens
        if args.speculative_num_steps is not None:
            k = min(k, args.speculative_num_steps)
        return cls(args.speculative_algorithm, k, args.speculative_ngram_min,
                   args.speculative_ngram_max, args.speculative_disable_by_batch_size,
                   args.speculative_draft_model_path)

    def build(self, tree_cache: "RadixCache", runner=None, tokenizer=None) -> "SpeculativeDecoding":
        """`runner`, `tokenizer`: the target's (a draft model is loaded beside it)."""
        return SpeculativeDecoding(make_drafter(self.algorithm, tree_cache, self.ngram_min,
                                                self.ngram_max, self.draft_model_path, runner,
                                                tokenizer, self.num_draft_tokens),
                                   self.num_draft_tokens, self.max_batch_size,
                                   cheap_verify_rows(getattr(runner, "model", None)))


class SpeculativeDecoding:
    def __init__(self, drafter: Drafter, num_draft_tokens: int, max_batch_size: int,
                 row_cap: int | None = None) -> None:
        """row_cap: the most rows a verify step should have (verify_rows.py; None: any)."""
        if num_draft_tokens < 1:
            raise ValueError(f"--speculative-num-draft-tokens must be >= 1, got {num_draft_tokens}")
        self.drafter = drafter
        self.k = num_draft_tokens
        self.max_batch_size = max_batch_size
        self.row_cap = row_cap
        if row_cap is not None and row_cap - 1 < num_draft_tokens:
            logger.info("speculative: verify steps keep to %d rows (the quantized linear "
                        "kernels' limit): at most %d drafts at batch 1", row_cap, row_cap - 1)
        self.stats = SpecStats(drafter.name, num_draft_tokens)
        self._state: dict[str, AdaptiveDraft] = {}
        self.adaptive = True  # False: every request drafts up to k each step (A/B scripts)
        self._steps = 0

    @staticmethod
    def can_ride(req: "Req") -> bool:
        """Whether a request may join a verify batch (its sampling needs nothing per step
        that a multi-row verify would get wrong: penalty counts, a jumped tail; grammars
        are checked per draft row, grammar_drafts.py)."""
        return req.jump_from is None and not req.uses_penalties

    def _budgets(self, reqs: list["Req"], context_len: int) -> list[int]:
        out = []
        for r in reqs:
            st = self._adaptive(r.rid)
            room = min(r.remaining_new_tokens, context_len - r.seq_len) - 1
            if room <= 0:  # its last token: a draft model's KV for it can go now
                self.drafter.forget(r.rid)
            out.append(max(0, min(st.budget(self._steps) if self.adaptive else self.k, room)))
        return cap_draft_budgets(out, self.row_cap)

    def _adaptive(self, rid: str) -> AdaptiveDraft:
        st = self._state.get(rid)
        if st is None:
            st = self._state[rid] = AdaptiveDraft(self.k)
        return st

    def _propose(self, reqs: list["Req"], context_len: int) -> list[Draft]:
        budgets = self._budgets(reqs, context_len)
        drafts = self.drafter.propose(reqs, budgets)
        return [d if len(d.tokens) <= n else
                Draft(d.tokens[:n], None if d.probs is None else d.probs[:n])
                for d, n in zip(drafts, budgets)]

    def run_step(self, sched: "Scheduler") -> bool:
        """Run one verify step in place of a decode step; False: decode as usual."""
        self._steps += 1
        self.forget_gone(sched.running)
        reqs = list(sched.running)
        if (not reqs or len(reqs) > self.max_batch_size
                or not all(self.can_ride(r) for r in reqs)):
            return False
        drafts = None
        if not self.drafter.costly:  # a draft model (costly) proposes once, below
            drafts = self._propose(reqs, sched.context_len)
            if not any(d.tokens for d in drafts):
                return False  # known state (overlap: lagged)
        if sched.inflight is not None:
            sched.finish_inflight()  # exact tokens: this step is serial
            reqs, drafts = list(sched.running), None
            if not reqs:
                return True
        if drafts is None:  # serial loop: the first proposal was already exact
            drafts = self._propose(reqs, sched.context_len)
        grammar = None
        if any(r.grammar is not None for r in reqs) and any(d.tokens for d in drafts):
            grammar = GrammarDrafts(sched.constrained.queue.backend, reqs, drafts)
            drafts = grammar.drafts
        if not any(d.tokens for d in drafts):
            return False
        batch = sched._batch(reqs, ForwardMode.EXTEND)
        try:
            fb = prepare_verify(batch, [d.tokens for d in drafts])
        except OutOfKVSlots:
            return False  # the decode path retracts if even one token each does not fit
        batch.commit_kv()
        row_reqs = [r for r, d in zip(reqs, drafts) for _ in range(len(d.tokens) + 1)]
        positions = [p + 1 for p in fb.positions.tolist()]
        task = ForwardTask(forward_batch=fb, sampling_reqs=row_reqs, keep=None,
                           rows=torch.tensor([r.req_pool_idx for r in row_reqs], dtype=torch.int64),
                           positions=positions,
                           return_logits=any(d.probs is not None for d in drafts),
                           grammar=grammar)
        for r in reqs:
            r.inflight += 1
        try:
            sampled = sched.worker.wait(sched.worker.launch(task))
        finally:
            for r in reqs:
                r.inflight -= 1
        self.stats.verify_steps += 1
        if sampled is not None and sampled.failed:
            fail_oom_requests(batch, sampled.failed, sched.kv, sched.queues, sched._answer,
                              sched.dashboard.note_oom)
        ok = sampled is not None and len(sampled.next_token_ids) == len(row_reqs)
        targets = sampled.next_token_ids.tolist() if ok else []
        lps = sampled.token_logprobs() if ok else []
        s = 0
        for r, d in zip(reqs, drafts):
            rows = slice(s, s + len(d.tokens) + 1)
            s += len(d.tokens) + 1
            if ok and not r.finished:
                if d.probs is None:  # a point mass: accept while the target drew the draft
                    m = 0
                    while m < len(d.tokens) and d.tokens[m] == targets[rows][m]:
                        m += 1
                    emitted = targets[rows][:m + 1]
                else:
                    emitted = self._rejection_sample(r, d, sampled.logits[rows], targets[rows])
                self._accept(sched, r, len(d.tokens), emitted, self._logprobs(
                    r, emitted, targets[rows], lps[rows], sampled.logits, rows))
            sched.kv.roll_back(r, r.seq_len - 1)
            if r.finished:
                self.drafter.forget(r.rid)  # a draft model's KV goes back at once
        return True

    @staticmethod
    def _rejection_sample(req: "Req", draft: Draft, logits: torch.Tensor,
                          targets: list[int]) -> list[int]:
        """Tokens emitted for a draft with its distribution (rejection.py); the target's
        own draw at the last row is the bonus token."""
        info = SamplingBatchInfo.from_reqs([req] * logits.shape[0], logits.shape[1],
                                           logits.device)
        p = Sampler.distribution(logits, info)
        return accept_with_probs(p, draft.probs.to(p.device), draft.tokens, targets[-1],
                                 req.generator)

    @staticmethod
    def _logprobs(req: "Req", emitted: list[int], targets: list[int], lps: list,
                  logits: torch.Tensor | None, rows: slice) -> list:
        """The target's logprobs of the emitted tokens: the sampler's where it drew the
        emitted token, else read from the row's logits (same alternatives)."""
        out = list(lps[:len(emitted)])
        for j, (e, t) in enumerate(zip(emitted, targets)):
            if e != t and out[j] is not None:
                row = torch.log_softmax(logits[rows][j].float(), dim=-1)
                out[j] = TokenLogprob(e, float(row[e]), out[j].top)
        return out

    def _accept(self, sched: "Scheduler", req: "Req", drafted: int, emitted: list[int],
                lps: list) -> None:
        """`emitted`: the accepted drafts then the target's token (len = accepted + 1)."""
        m = len(emitted) - 1
        if drafted:
            self.stats.record(drafted, m)
            if self.adaptive:
                self._adaptive(req.rid).record(self._steps, drafted, m)
        op = sched.output_processor
        for tok, lp in zip(emitted, lps):
            req.output_ids.append(tok)
            if lp is not None:
                req.pending_logprobs.append(lp)
            if req.grammar is not None:  # the matcher advances (may finish the request)
                ConstrainedDecoding.accept(req, tok)
            op.check_finished(req, tok)
            if req.finished:
                break  # the tokens after a stop are dropped
        if req.stream and not req.finished and op.stream_due(req):
            sched.outbox.append(op.make_output(req))

    def forget_gone(self, running: list["Req"]) -> None:
        """Drop per-request state (and a draft model's KV) of requests no longer running:
        finished, aborted, retracted. O(running + gone since the last call)."""
        live = {r.rid for r in running}
        for rid in [rid for rid in self._state if rid not in live]:
            del self._state[rid]
            self.drafter.forget(rid)
        for rid in [rid for rid in self.drafter.tracked if rid not in live]:
            self.drafter.forget(rid)
