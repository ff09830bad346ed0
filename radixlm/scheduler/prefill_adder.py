"""PrefillAdder: which waiting requests join the next EXTEND batch.

Budgets, checked per candidate in policy order (the first that does not fit stops the
scan, so the queue head is never starved by smaller requests behind it):
  * a free req_to_token row and room under --max-running-requests;
  * prefill tokens: the batch's extend tokens stay under --max-prefill-tokens (one
    request is always allowed, so a long prompt is never stuck);
  * KV: free slots must cover the candidate's extend tokens plus a decode reserve for it
    and for every running request (min(remaining new tokens, DECODE_RESERVE) each), so
    that admitted requests can decode for a while before retraction is needed.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from radixlm.scheduler.req import Req

DECODE_RESERVE = 16


def decode_reserve(req: Req) -> int:
    return min(req.remaining_new_tokens, DECODE_RESERVE)


@dataclass
class PrefillAdder:
    free_kv_slots: int
    free_rows: int
    max_prefill_tokens: int
    running: list[Req]
    admitted: list[Req] = field(default_factory=list)
    prefill_tokens: int = 0

    def __post_init__(self) -> None:
        self.kv_budget = self.free_kv_slots - sum(decode_reserve(r) for r in self.running)

    def try_add(self, req: Req) -> bool:
        """Admit `req` if every budget allows; False stops the scan."""
        if len(self.admitted) >= self.free_rows:
            return False
        if self.admitted and self.prefill_tokens + req.extend_len > self.max_prefill_tokens:
            return False
        need = req.extend_len + decode_reserve(req)
        if need > self.kv_budget:
            return False
        self.kv_budget -= need
        self.prefill_tokens += req.extend_len
        self.admitted.append(req)
        return True
