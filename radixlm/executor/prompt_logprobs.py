"""Prompt logprobs on the forward thread: extra logits rows for the prompt positions of
the requests that asked (vLLM's prompt_logprobs), reduced at once to the logprob of each
next prompt token (+ top-k).

Invariants: only the plan's P positions get logits rows (the model projects
`logits_indices ++ plan.token_idx`, the first B rows are the batch's own); nothing of the
[P, V] rows outlives `reduce`; the result stays as tensors until the scheduler thread reads
it after the one-step-late wait (like LogprobTensors).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

from radixlm.forward_batch import ForwardBatch


@dataclass
class PromptLogprobPlan:
    """Which flat tokens of an EXTEND batch need their logits for prompt logprobs."""
    token_idx: torch.Tensor  # [P] int64: flat index into the batch's tokens
    targets: torch.Tensor  # [P] int64: the prompt token that follows each of them
    top_k: int  # the largest top-k asked in the batch (0: only the targets)
    req_index: list[int]  # per planned request: its index in the batch
    counts: list[int]  # per planned request: how many of the P rows are its (in order)
    top_counts: list[int]  # per planned request: its own top-k

    def with_extra_rows(self, fb: ForwardBatch) -> ForwardBatch:
        """`fb` whose logits also cover the plan's positions (after its own B rows)."""
        return dataclasses.replace(fb, logits_indices=torch.cat([fb.logits_indices,
                                                                 self.token_idx]))

    def reduce(self, extra_logits: torch.Tensor) -> "PromptLogprobTensors":
        """[P, V] logits of the planned positions -> their target logprobs and top-k."""
        raw = torch.log_softmax(extra_logits.float(), dim=-1)
        chosen = raw.gather(1, self.targets.unsqueeze(1)).squeeze(1)
        ranks = (raw > chosen.unsqueeze(1)).sum(dim=-1) + 1  # vLLM's rank: 1 = the most likely
        top_vals = top_ids = None
        if self.top_k:
            top_vals, top_ids = raw.topk(self.top_k, dim=-1)
        return PromptLogprobTensors(self.targets, chosen, ranks, top_vals, top_ids,
                                    self.req_index, self.counts, self.top_counts)


@dataclass
class PromptLogprobTensors:
    targets: torch.Tensor  # [P] int64
    chosen: torch.Tensor  # [P] float32
    ranks: torch.Tensor  # [P] int64
    top_values: torch.Tensor | None  # [P, k_max]
    top_ids: torch.Tensor | None  # [P, k_max]
    req_index: list[int]
    counts: list[int]
    top_counts: list[int]

    def map_tensors(self, fn) -> "PromptLogprobTensors":
        opt = lambda t: None if t is None else fn(t)  # noqa: E731
        return PromptLogprobTensors(fn(self.targets), fn(self.chosen), fn(self.ranks),
                                    opt(self.top_values),
                                    opt(self.top_ids), self.req_index, self.counts,
                                    self.top_counts)
