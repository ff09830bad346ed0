"""The CPU's out-of-memory: an activation budget checked before every forward.

On CUDA the caching allocator raises `torch.OutOfMemoryError` when a forward's
activations do not fit what the KV pool left. The CPU has no such wall (the host swaps or
the kernel's OOM killer ends the process), so there the planned activation pool is a
budget: before a batch runs, its activation estimate (`ActivationModel`) is compared with
the budget and `ActivationBudgetExceeded` is raised instead of running it. Both errors go
to the same recovery (`scheduler/oom_recovery.py`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from radixlm.planning.activation import ActivationModel
from radixlm.planning.units import fmt_bytes

if TYPE_CHECKING:
    from radixlm.forward_batch import ForwardBatch


class ActivationBudgetExceeded(MemoryError):
    """A batch's activation estimate exceeds the activation budget; nothing ran."""

    def __init__(self, need: int, budget: int) -> None:
        super().__init__(f"the batch needs about {fmt_bytes(need)} of activation memory, "
                         f"the activation budget is {fmt_bytes(budget)}")
        self.need = need
        self.budget = budget


def batch_activation_bytes(model: ActivationModel, fb: "ForwardBatch") -> int:
    """The activation estimate of one ForwardBatch (EXTEND/MIXED or DECODE)."""
    if fb.forward_mode.is_decode():
        return model.decode_bytes(fb.batch_size, max(fb.seq_lens_cpu, default=0))
    return model.extend_bytes(list(fb.extend_seq_lens_cpu), list(fb.seq_lens_cpu))


@dataclass
class ActivationGuard:
    model: ActivationModel
    budget: int  # bytes; the plan's activation pool

    def check(self, fb: "ForwardBatch") -> None:
        """Raise ActivationBudgetExceeded if `fb` would not fit the budget."""
        need = batch_activation_bytes(self.model, fb)
        if need > self.budget:
            raise ActivationBudgetExceeded(need, self.budget)
