"""The row cap of a verify step: cut drafts so the step stays on the small-batch kernels.

A quantized model's linear methods (`SmallBatchQuantized`: int4/int8 weight-only, bf16 CPU
runs) use their kernel for calls of at most `max_m` rows and a dense GEMM beyond. A verify
step of B requests with k_i drafts is B + sum(k_i) rows through every linear layer; past
max_m rows it pays the dense path, and its rows are no longer computed as the decode steps
compute them (greedy outputs could drift). So while B < max_m the drafts are cut to fit
max_m rows, shared round-robin among the requests that want them. On the default model in
bf16 on an AVX512-BF16 CPU that is 8 rows (the int4 x bf16 projections and the int8-group
head both take 8: k = 7 at batch 1); without AVX512-BF16, 4.
No cap (None) for a model without such methods (float32 runs, dense weights) or B >= max_m.
Invariants: a budget is only ever lowered; exactness does not depend on draft lengths.
"""

from __future__ import annotations

from torch import nn

from radixlm.models.linear.method import SmallBatchQuantized
from radixlm.models.linear.policy import top_level_methods


def cheap_verify_rows(model: nn.Module | None) -> int | None:
    """The most rows a forward may have and keep every quantized method on its kernel."""
    if model is None:
        return None
    limits = [m.max_m for m in top_level_methods(model) if isinstance(m, SmallBatchQuantized)]
    return min(limits) if limits else None


def cap_draft_budgets(budgets: list[int], row_cap: int | None) -> list[int]:
    """Each request's draft budget lowered so that len(budgets) + sum(result) <= row_cap
    (one row per request plus its drafts), handed out one draft at a time in request order;
    unchanged when there is no cap or the requests alone reach it."""
    if row_cap is None or len(budgets) >= row_cap:
        return list(budgets)
    room = row_cap - len(budgets)
    out = [0] * len(budgets)
    while room > 0:
        progressed = False
        for i, want in enumerate(budgets):
            if room > 0 and out[i] < want:
                out[i] += 1
                room -= 1
                progressed = True
        if not progressed:
            break
    return out
