"""ReqToTokenPool: request slot -> the KV slot of each of its token positions.

`req_to_token[r, p]` is the token_to_kv_pool slot holding the K/V of position `p` of the
request in row `r`. Only positions `< seq_len` of a live request are meaningful; the
rest is stale. Rows are handed out from a free list; a row is reused as soon as it is
freed, so readers must go through the request's own `req_pool_idx`.

Row `dummy_row` (== size, one past the rows handed out) is never allocated and stays all
zeros, i.e. every position points at the dummy KV slot 0: the padding rows of a CUDA-graph
decode batch read through it (executor/decode_graph_runner.py).
"""

from __future__ import annotations

import torch


class ReqToTokenPool:
    def __init__(self, size: int, max_context_len: int, device: torch.device | str = "cpu") -> None:
        self.size = size
        self.max_context_len = max_context_len
        self.device = torch.device(device)
        # size real rows + the dummy row.
        self.req_to_token = torch.zeros((size + 1, max_context_len), dtype=torch.int32,
                                        device=self.device)
        self.dummy_row = size
        self.free_rows: list[int] = list(range(size))

    def available_size(self) -> int:
        return len(self.free_rows)

    def alloc(self) -> int | None:
        return self.free_rows.pop() if self.free_rows else None

    def free(self, row: int) -> None:
        assert row not in self.free_rows, f"double free of req_to_token row {row}"
        self.free_rows.append(row)

    def write(self, row: int, start: int, slots: torch.Tensor) -> None:
        """Record that positions [start, start + len(slots)) of `row` live in `slots`."""
        self.req_to_token[row, start:start + slots.numel()] = slots.to(torch.int32)

    def clear(self) -> None:
        self.free_rows = list(range(self.size))
