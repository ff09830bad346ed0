"""Prompt logprobs (vLLM's prompt_logprobs) on the scheduler side: which prompt positions
an EXTEND batch must return logits for, and their results accumulated on the Req. The same
rows give a jump-forward's jumped output tokens their logprobs (`req.logprob_gap`).

Invariants: entry i of `req.prompt_logprobs` is prompt token s + i + 1 given tokens
0..s + i (s: the request's logprob_start_len, SGLang's; 0 by default), so its length only
grows, position by position, across chunks (overlap: a chunk launched before the previous
chunk's results arrived plans from its own prefix); while s + its length is short of
len(input_ids) - 1 the request matches the radix cache only up to position s (cached
positions have no logits, as in vLLM); it is sent once, complete, on its first output after.
Python work per step grows with the number of requests, not with their tokens.
"""

from __future__ import annotations

import torch

from radixlm.executor.prompt_logprobs import PromptLogprobPlan, PromptLogprobTensors
from radixlm.forward_batch import ForwardBatch
from radixlm.messages import PromptLogprobs, TokenLogprob
from radixlm.scheduler.req import Req


def _done(req: Req) -> int:
    """The first prompt position whose logits are still wanted (it predicts the next token)."""
    start = req.sampling_params.logprob_start_len
    return start + (0 if req.prompt_logprobs is None else len(req.prompt_logprobs.token_ids))


def needs_prompt_logprobs(req: Req) -> bool:
    """The request asked for prompt logprobs and not all of them are computed yet."""
    return (req.sampling_params.prompt_logprobs is not None
            and _done(req) < len(req.input_ids) - 1)


def cache_match_len(req: Req) -> int:
    """How many leading fill_ids admission may take from the radix cache: positions whose
    logits are still wanted must be computed (at least the last token always is)."""
    if needs_prompt_logprobs(req):
        return min(req.sampling_params.logprob_start_len, len(req.input_ids) - 1)
    if req.logprob_gap is not None:  # a jumped tail whose logprobs are still to come
        return len(req.input_ids) + req.logprob_gap - 1
    return req.seq_len - 1


def _wanted(req: Req) -> tuple[int, int, int | None, list[int]]:
    """Positions [lo, hi) whose logits give a logprob `req` still waits for, the top-k,
    and the ids those positions predict (from lo + 1)."""
    p = req.sampling_params
    if req.logprob_gap is not None and not needs_prompt_logprobs(req):
        lo = len(req.input_ids) + req.logprob_gap - 1
        return lo, req.seq_len - 1, p.top_logprobs, req.fill_ids
    return _done(req), len(req.input_ids) - 1, p.prompt_logprobs, req.input_ids


def plan_prompt_logprobs(extend_reqs: list[Req], fb: ForwardBatch) -> PromptLogprobPlan | None:
    """The positions of `fb` (an EXTEND/MIXED batch whose first requests are `extend_reqs`)
    whose logits give a prompt logprob (or a jumped token's) not yet collected; None when
    there are none."""
    idx, targets, req_index, counts, tops = [], [], [], [], []
    start = 0
    for i, (req, prefix, n) in enumerate(zip(extend_reqs, fb.extend_prefix_lens_cpu,
                                             fb.extend_seq_lens_cpu)):
        first, last, k, ids = _wanted(req)
        # Position p (its logits) gives the logprob of token p + 1.
        lo, hi = max(prefix, first), min(prefix + n, last)
        if k is not None and hi > lo:
            idx.append(torch.arange(lo, hi, dtype=torch.int64) + (start - prefix))
            targets.append(torch.tensor(ids[lo + 1:hi + 1], dtype=torch.int64))
            req_index.append(i)
            counts.append(hi - lo)
            tops.append(k)
        start += n
    if not idx:
        return None
    return PromptLogprobPlan(torch.cat(idx), torch.cat(targets), max(tops), req_index,
                             counts, tops)


def deliver_prompt_logprobs(reqs: list[Req], t: PromptLogprobTensors) -> None:
    """Append a processed batch's prompt logprobs (host tensors) to its requests."""
    off = 0
    for i, n, k in zip(t.req_index, t.counts, t.top_counts):
        req = reqs[i]
        if req.logprob_gap is not None and not needs_prompt_logprobs(req):
            _deliver_jumped(req, t, off, n, k)
            off += n
            continue
        if req.prompt_logprobs is None:
            req.prompt_logprobs = PromptLogprobs()
        out = req.prompt_logprobs
        out.token_ids.extend(t.targets[off:off + n].tolist())
        out.logprobs.extend(t.chosen[off:off + n].tolist())
        out.ranks.extend(t.ranks[off:off + n].tolist())
        if k:
            out.top_ids.extend(t.top_ids[off:off + n, :k].tolist())
            out.top_values.extend(t.top_values[off:off + n, :k].tolist())
        off += n


def _deliver_jumped(req: Req, t: PromptLogprobTensors, off: int, n: int, k: int) -> None:
    """The logprobs of `n` jumped output tokens from `req.logprob_gap` on, in order; the gap
    closes once every jumped token has one (they are then sent)."""
    ids = t.targets[off:off + n].tolist()
    values = t.chosen[off:off + n].tolist()
    top_ids = t.top_ids[off:off + n, :k].tolist() if k else [[]] * n
    top_values = t.top_values[off:off + n, :k].tolist() if k else [[]] * n
    for tok, v, ti, tv in zip(ids, values, top_ids, top_values):
        req.pending_logprobs.append(TokenLogprob(tok, v, list(zip(ti, tv))))
    req.logprob_gap += n
    if req.logprob_gap >= len(req.output_ids):
        req.logprob_gap = None


def take_prompt_logprobs(req: Req) -> PromptLogprobs | None:
    """The complete prompt logprobs, the first time they are complete; else None."""
    if req.sampling_params.prompt_logprobs is None or req.prompt_logprobs_sent:
        return None
    if needs_prompt_logprobs(req):
        return None
    req.prompt_logprobs_sent = True
    return req.prompt_logprobs or PromptLogprobs()
