"""Prompt logprobs (vLLM's prompt_logprobs) on the scheduler side: which prompt positions
an EXTEND batch must return logits for, and their results accumulated on the Req.

Invariants: entry i of `req.prompt_logprobs` is prompt token i + 1 given tokens 0..i, so
its length only grows, position by position, across chunks (overlap: a chunk launched
before the previous chunk's results arrived plans from its own prefix); while it is short
of len(input_ids) - 1 the request skips the radix-cache match (cached positions have no
logits, as in vLLM); it is sent once, complete, on the request's first output after it.
Python work per step grows with the number of requests, not with their tokens.
"""

from __future__ import annotations

import torch

from radixlm.executor.prompt_logprobs import PromptLogprobPlan, PromptLogprobTensors
from radixlm.forward_batch import ForwardBatch
from radixlm.messages import PromptLogprobs
from radixlm.scheduler.req import Req


def _done(req: Req) -> int:
    return 0 if req.prompt_logprobs is None else len(req.prompt_logprobs.token_ids)


def needs_prompt_logprobs(req: Req) -> bool:
    """The request asked for prompt logprobs and not all of them are computed yet."""
    return (req.sampling_params.prompt_logprobs is not None
            and _done(req) < len(req.input_ids) - 1)


def plan_prompt_logprobs(extend_reqs: list[Req], fb: ForwardBatch) -> PromptLogprobPlan | None:
    """The positions of `fb` (an EXTEND/MIXED batch whose first requests are `extend_reqs`)
    whose logits give a prompt logprob not yet collected; None when there are none."""
    idx, targets, req_index, counts, tops = [], [], [], [], []
    start = 0
    for i, (req, prefix, n) in enumerate(zip(extend_reqs, fb.extend_prefix_lens_cpu,
                                             fb.extend_seq_lens_cpu)):
        k = req.sampling_params.prompt_logprobs
        # Position p (its logits) gives the logprob of prompt token p + 1.
        lo, hi = max(prefix, _done(req)), min(prefix + n, len(req.input_ids) - 1)
        if k is not None and hi > lo:
            idx.append(torch.arange(lo, hi, dtype=torch.int64) + (start - prefix))
            targets.append(torch.tensor(req.input_ids[lo + 1:hi + 1], dtype=torch.int64))
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


def take_prompt_logprobs(req: Req) -> PromptLogprobs | None:
    """The complete prompt logprobs, the first time they are complete; else None."""
    if req.sampling_params.prompt_logprobs is None or req.prompt_logprobs_sent:
        return None
    if needs_prompt_logprobs(req):
        return None
    req.prompt_logprobs_sent = True
    return req.prompt_logprobs or PromptLogprobs()
