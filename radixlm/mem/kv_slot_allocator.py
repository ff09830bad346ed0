"""KVSlotAllocator: hands out the KV slots of the token_to_kv_pool, in whole pages.

Layout
------
Slots are 1..size; slot 0 is the dummy that padded tokens write to and is never handed
out. The slots are cut into `num_pages = size // page_size` pages (a pool size that is not
a multiple of the page is rounded down, so `size` may be smaller than asked): page `p`
(0-based) is slots `[p * page_size + 1, (p + 1) * page_size]`, i.e. slot `s` is offset
`(s - 1) % page_size` of page `(s - 1) // page_size`. With `page_size == 1` (the default) a
page is one slot and this is a plain slot free list.

More: docs/memory.md, "mem/kv_slot_allocator.py".
"""

from __future__ import annotations

import torch


class KVSlotAllocator:
    def __init__(self, size: int, device: torch.device | str = "cpu", page_size: int = 1) -> None:
        if page_size < 1:
            raise ValueError(f"page_size must be >= 1, got {page_size}")
        if size < page_size:
            raise ValueError(f"a KV pool of {size} slots holds no page of {page_size} slots")
        self.page_size = page_size
        self.num_pages = size // page_size
        self.size = self.num_pages * page_size  # in slots, rounded down to whole pages
        self.device = torch.device(device)
        self.clear()

    def clear(self) -> None:
        """Mutates: every page is free again."""
        self.free_pages = torch.arange(self.num_pages, dtype=torch.int64, device=self.device)

    # --- sizes and views -------------------------------------------------------------

    def available_size(self) -> int:
        """Free slots (free pages * page_size)."""
        return int(self.free_pages.numel()) * self.page_size

    @property
    def free_slots(self) -> torch.Tensor:
        """Every slot of every free page (int64), page by page (for checks and tests)."""
        return self.pages_to_slots(self.free_pages)

    def pages_to_slots(self, pages: torch.Tensor) -> torch.Tensor:
        """The slots of `pages`, in page order then offset order."""
        if self.page_size == 1:
            return pages + 1
        offsets = torch.arange(self.page_size, dtype=torch.int64, device=pages.device)
        return (pages[:, None] * self.page_size + 1 + offsets).reshape(-1)

    def new_slots_needed(self, prefix_lens: torch.Tensor, seq_lens: torch.Tensor) -> int:
        """Slots of the fresh pages needed to grow requests from `prefix_lens` to `seq_lens`
        tokens: page_size * sum(ceil(seq / page_size) - ceil(prefix / page_size))."""
        n = self.page_size
        return n * int(((seq_lens + n - 1) // n - (prefix_lens + n - 1) // n).sum())

    # --- alloc ---------------------------------------------------------------------------

    def alloc_pages(self, k: int) -> torch.Tensor | None:
        """Take `k` free pages (their ids); None (nothing taken) when fewer are free.
        Mutates the free list."""
        if k > self.free_pages.numel():
            return None
        out, self.free_pages = self.free_pages[:k], self.free_pages[k:]
        return out

    def alloc(self, n: int) -> torch.Tensor | None:
        """Take `n` slots that form `n / page_size` whole pages (n must be a multiple of the
        page size); None (nothing taken) when too few are free. Mutates the free list."""
        if n % self.page_size:
            raise ValueError(f"alloc({n}): not a whole number of {self.page_size}-slot pages; "
                             "use alloc_extend/alloc_decode for request positions")
        pages = self.alloc_pages(n // self.page_size)
        return None if pages is None else self.pages_to_slots(pages)

    def alloc_extend(self, prefix_lens: torch.Tensor, extend_lens: torch.Tensor,
                     last_slots: torch.Tensor) -> torch.Tensor | None:
        """Slots for positions `prefix_lens[b] .. prefix_lens[b] + extend_lens[b] - 1` of
        every request b, flat in request order ([sum(extend_lens)] int64).

        `last_slots[b]` is the slot of position `prefix_lens[b] - 1` (only read when that
        position is not the end of a page, i.e. the request has a partly filled last page).
        Mutates: takes the fresh pages from the free list; returns None and takes nothing
        when too few pages are free. The caller records the slots in req_to_token.
        """
        dev = self.device
        prefix = prefix_lens.to(dev, torch.int64)
        ext = extend_lens.to(dev, torch.int64)
        n = self.page_size
        if n == 1:
            return self.alloc(int(ext.sum()))
        # Pages a request has before and after this step: ceil(len / n).
        owned = (prefix + n - 1) // n
        new_pages = (prefix + ext + n - 1) // n - owned
        pages = self.alloc_pages(int(new_pages.sum()))
        if pages is None:
            return None
        total = int(ext.sum())
        req = torch.repeat_interleave(torch.arange(prefix.numel(), device=dev), ext,
                                      output_size=total)  # [T]: request of each token
        tok_start = torch.cumsum(ext, 0) - ext  # flat index of each request's first token
        pos = prefix[req] + torch.arange(total, device=dev) - tok_start[req]  # [T] positions
        # Positions below owned * n fill the partly filled last page: position p sits
        # (p - (prefix - 1)) slots after the slot of position prefix - 1.
        in_last_page = pos < owned[req] * n
        cont = last_slots.to(dev, torch.int64)[req] + (pos - prefix[req]) + 1
        if pages.numel() == 0:
            return cont
        # Otherwise position p is offset p % n of the request's (p // n - owned)-th fresh
        # page; request b's fresh pages are pages[page_start[b] : page_start[b] + new_pages[b]].
        page_start = torch.cumsum(new_pages, 0) - new_pages
        page_idx = (page_start[req] + pos // n - owned[req]).clamp(0, pages.numel() - 1)
        fresh = pages[page_idx] * n + 1 + pos % n
        return torch.where(in_last_page, cont, fresh)

    def alloc_decode(self, positions: torch.Tensor,
                     last_slots: torch.Tensor) -> torch.Tensor | None:
        """One slot per request for position `positions[b]` ([B] int64): offset 0 of a
        fresh page when the position is page-aligned, else `last_slots[b] + 1` (the slot
        after that of position `positions[b] - 1`, in the same page).
        Mutates: takes the fresh pages; returns None and takes nothing when short."""
        dev = self.device
        pos = positions.to(dev, torch.int64)
        n = self.page_size
        if n == 1:
            return self.alloc(pos.numel())
        needs_page = pos % n == 0
        pages = self.alloc_pages(int(needs_page.sum()))
        if pages is None:
            return None
        out = last_slots.to(dev, torch.int64) + 1
        out[needs_page] = pages * n + 1
        return out

    # --- free ------------------------------------------------------------------------------

    def free(self, slots: torch.Tensor) -> None:
        """Give back the pages whose first slot is in `slots` (all of `slots` when
        page_size is 1); other slots are ignored: they belong to a page whose first slot
        the same owner gives back in this call (see the module docstring). The caller must
        not hold any slot of those pages anywhere afterwards. Mutates the free list."""
        if not slots.numel():
            return
        slots = slots.to(self.free_pages)
        if self.page_size == 1:
            pages = slots - 1
        else:
            first = slots[(slots - 1) % self.page_size == 0]
            pages = (first - 1) // self.page_size
        self.free_pages = torch.cat([self.free_pages, pages])
