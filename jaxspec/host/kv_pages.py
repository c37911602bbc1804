"""Host-side page allocator and per-sequence page tables for the paged KV cache.

The device cache (`jaxspec.device.kv_cache`) is pure arrays; which page belongs to which sequence
is decided here. Page 0 (`kv_cache.NULL_PAGE`) is never handed out.

Admission reserves pages for a sequence's whole worst case (prompt + max_new_tokens + 1 + K), so a
running sequence never waits for a page and nothing is ever preempted; pages are *allocated*
lazily as the sequence grows and all return to the free list when it finishes. A rollback frees
nothing: the rejected drafts' slots are overwritten by the next step.
"""

import math

import numpy as np

from jaxspec.device import kv_cache


class PageAllocator:
    """Free list of page indices 1..num_pages-1, plus reservation accounting."""

    def __init__(self, num_pages: int, page_size: int):
        if num_pages < 2:
            raise ValueError(f"num_pages must be >= 2 (page 0 is the null page), got {num_pages}")
        if page_size < 1:
            raise ValueError(f"page_size must be >= 1, got {page_size}")
        self.num_pages = num_pages
        self.page_size = page_size
        self._free = list(range(num_pages - 1, kv_cache.NULL_PAGE, -1))   # pop() gives page 1 first
        self._reserved = 0                                                 # promised, not allocated

    @property
    def num_free(self) -> int:
        """Pages neither allocated nor promised to a running sequence."""
        return len(self._free) - self._reserved

    def pages_for(self, num_tokens: int) -> int:
        return math.ceil(num_tokens / self.page_size)

    def reserve(self, num_pages: int) -> bool:
        """Promises pages to a sequence; False (and nothing changes) when they are not free."""
        if num_pages > self.num_free:
            return False
        self._reserved += num_pages
        return True

    def unreserve(self, num_pages: int):
        if num_pages > self._reserved:
            raise ValueError(f"unreserving {num_pages} pages but only {self._reserved} reserved")
        self._reserved -= num_pages

    def take_reserved(self) -> int:
        """Hands out one page out of a reservation."""
        if self._reserved < 1 or not self._free:
            raise RuntimeError("take_reserved without a reservation")
        self._reserved -= 1
        return self._free.pop()

    def give_back(self, pages: list[int]):
        for p in pages:
            if p == kv_cache.NULL_PAGE or not 0 < p < self.num_pages:
                raise ValueError(f"page {p} was never handed out")
        self._free.extend(reversed(pages))


class SequencePages:
    """The pages of one sequence and the reservation that backs its future growth."""

    def __init__(self, allocator: PageAllocator, max_tokens: int):
        """Reserves pages for `max_tokens` slots; raises ValueError if they are not free."""
        self._alloc = allocator
        self._budget = allocator.pages_for(max_tokens)
        if not allocator.reserve(self._budget):
            raise ValueError(f"not enough free KV pages for {max_tokens} tokens "
                             f"({self._budget} pages, {allocator.num_free} free)")
        self.pages: list[int] = []

    @property
    def capacity(self) -> int:
        """Token slots allocated now."""
        return len(self.pages) * self._alloc.page_size

    def ensure(self, num_tokens: int):
        """Allocates pages (from the reservation) until `num_tokens` slots exist."""
        need = self._alloc.pages_for(num_tokens)
        if need > self._budget:
            raise ValueError(f"sequence needs {num_tokens} slots, more than the {self._budget} "
                             f"pages reserved for it")
        while len(self.pages) < need:
            self.pages.append(self._alloc.take_reserved())

    def release(self):
        """Returns every page and the remaining reservation."""
        self._alloc.give_back(self.pages)
        self._alloc.unreserve(self._budget - len(self.pages))
        self.pages = []
        self._budget = 0

    def table_row(self, num_cols: int) -> np.ndarray:
        """i32[num_cols] page-table row, NULL_PAGE past the allocated pages."""
        row = np.full((num_cols,), kv_cache.NULL_PAGE, np.int32)
        n = min(num_cols, len(self.pages))
        row[:n] = self.pages[:n]
        return row
