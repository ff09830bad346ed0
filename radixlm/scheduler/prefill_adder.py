"""PrefillAdder: which waiting requests join the next EXTEND batch, and how much of each.

Budgets, checked per candidate in policy order (the first that does not fit stops the
scan, so the queue head is never starved by smaller requests behind it):
  * a free req_to_token row and room under --max-running-requests (a request already
    holding a row, i.e. a chunked prefill in progress, needs none);
  * prefill tokens: the batch's extend tokens stay under the prefill budget,
    min(--max-prefill-tokens, --chunked-prefill-size). With chunking, a request that does
    not fit is truncated to what is left (it becomes the chunked request and the scan
    stops); without it, one request is always allowed alone, so none is stuck forever;
  * KV: free + evictable slots must cover the candidate's extend tokens plus a decode
    reserve for it and for every running request (min(remaining new tokens,
    DECODE_RESERVE) each), so admitted requests can decode a while before retraction is
    needed. A chunk (not the last) needs no decode reserve yet; with chunking, a prompt
    larger than the KV budget is truncated to it.
The amount admitted for each request is left in `req.extend_input_len`.
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
    prefill_budget: int
    chunking: bool
    running: list[Req]
    admitted: list[Req] = field(default_factory=list)
    prefill_tokens: int = 0
    new_rows: int = 0

    def __post_init__(self) -> None:
        self.kv_budget = self.free_kv_slots - sum(decode_reserve(r) for r in self.running)

    def try_add(self, req: Req) -> bool:
        """Admit (a chunk of) `req` if every budget allows; False stops the scan."""
        needs_row = req.req_pool_idx is None
        if needs_row and self.new_rows >= self.free_rows:
            return False
        left = self.prefill_budget - self.prefill_tokens
        n = req.extend_len
        if n > left:
            if self.chunking:
                n = left
            elif self.admitted:
                return False
        if self.chunking and n + decode_reserve(req) > self.kv_budget and n == req.extend_len:
            n = min(n, self.kv_budget)  # a prompt larger than the KV left: one chunk of it
        last_chunk = n == req.extend_len
        need = n + (decode_reserve(req) if last_chunk else 0)
        if n <= 0 or need > self.kv_budget:
            return False
        req.extend_input_len = n
        self.kv_budget -= need
        self.prefill_tokens += n
        self.new_rows += needs_row
        self.admitted.append(req)
        return True
