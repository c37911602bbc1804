"""Token budget, KV pages, placeholder drafts and chunked prefill.

Each iteration the scheduler fills one budget of `max_num_tokens` tokens:
  1. every decoding request reserves `1 + K` tokens (its placeholder drafts) before anything else
     is scheduled, so verification can never be starved;
  2. the rest of the budget goes to prompt chunks, oldest request first (chunked prefill);
  3. waiting requests are admitted while there is a free batch row and KV pages for their whole
     worst case (prompt + max_new_tokens + 1 + max K): admitted requests never wait for pages.
"""

import collections
import dataclasses
import math

from jaxspec.host import kv_pages
from jaxspec.host import requests as requests_lib


@dataclasses.dataclass(frozen=True, kw_only=True)
class SchedulerConfig:
    """Capacity of the engine.

    Attributes:
      max_batch_size: requests running at once (prefilling or decoding).
      max_num_tokens: tokens one iteration may process (prompt chunks + 1 + K per decode row).
      max_seq_len: longest sequence (prompt + generated) a request may reach.
      page_size: tokens per KV page.
      num_pages: KV pages including the null page; None = enough for max_batch_size sequences of
        max_seq_len (+ the largest draft window).
      prefill_chunk: longest prompt chunk one request prefills per iteration.
      batch_buckets: compile buckets for batch rows (None: powers of two); the schedule's keys and
        max_batch_size are always added (see `jaxspec.schedule.batch_buckets`). Fewer buckets
        mean fewer compilations and more padding rows.
      prefill_buckets: compile buckets for prompt-chunk lengths; prefill_chunk is always added.
    """

    max_batch_size: int = 8
    max_num_tokens: int = 2048
    max_seq_len: int = 2048
    page_size: int = 16
    num_pages: int | None = None
    prefill_chunk: int = 512
    batch_buckets: tuple[int, ...] | None = None
    prefill_buckets: tuple[int, ...] = (16, 32, 64, 128, 256, 512, 1024, 2048)  # x2: <= 50% pad

    def __post_init__(self):
        for name in ("max_batch_size", "max_num_tokens", "max_seq_len", "page_size",
                     "prefill_chunk"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an int >= 1, got {value!r}")
        if self.num_pages is not None and self.num_pages < 2:
            raise ValueError(f"num_pages must be >= 2, got {self.num_pages}")
        for name in ("batch_buckets", "prefill_buckets"):
            value = getattr(self, name)
            if value is None and name == "batch_buckets":
                continue
            if (not isinstance(value, tuple) or not value
                    or any(not isinstance(b, int) or b < 1 for b in value)):
                raise ValueError(f"{name} must be a non-empty tuple of ints >= 1, got {value!r}")

    @property
    def chunk_buckets(self) -> tuple[int, ...]:
        """Prompt-chunk widths: the prefill buckets up to prefill_chunk, and prefill_chunk."""
        return tuple(sorted({b for b in self.prefill_buckets if b < self.prefill_chunk}
                            | {self.prefill_chunk}))

    def pages_per_seq(self, max_draft_len: int) -> int:
        return math.ceil((self.max_seq_len + 1 + max_draft_len) / self.page_size)

    def total_pages(self, max_draft_len: int) -> int:
        if self.num_pages is not None:
            return self.num_pages
        return self.max_batch_size * self.pages_per_seq(max_draft_len) + 1


@dataclasses.dataclass
class Chunk:
    """A prompt chunk: `request.prompt[start:start + length]`."""

    request: requests_lib.Request
    start: int
    length: int

    @property
    def completes_prompt(self) -> bool:
        return self.start + self.length == len(self.request.prompt)


@dataclasses.dataclass
class ScheduledBatch:
    decode: list[requests_lib.Request]
    prefill: list[Chunk]

    @property
    def num_tokens(self) -> int:
        return sum(c.length for c in self.prefill)


class Scheduler:
    """Owns the request queues and the KV page allocator."""

    def __init__(self, config: SchedulerConfig, *, max_draft_len: int):
        self.config = config
        self.max_draft_len = max_draft_len
        self.allocator = kv_pages.PageAllocator(config.total_pages(max_draft_len),
                                                config.page_size)
        self.waiting: collections.deque[requests_lib.Request] = collections.deque()
        self.running: list[requests_lib.Request] = []

    def worst_case_tokens(self, request: requests_lib.Request) -> int:
        return request.max_sequence_length + 1 + self.max_draft_len

    def add(self, request: requests_lib.Request):
        """Queues a request (its prompt already checked, `requests.check_prompt`).

        Raises:
          ValueError: its worst case needs more KV pages than the whole cache has.
        """
        total = self.allocator.pages_for(self.worst_case_tokens(request))
        if total > self.allocator.num_pages - 1:
            raise ValueError(f"request needs {total} KV pages, the cache has "
                             f"{self.allocator.num_pages - 1}")
        self.waiting.append(request)

    @property
    def num_active(self) -> int:
        """Requests admitted and not finished (TRT-LLM's active requests)."""
        return len(self.running)

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def _admit(self):
        while self.waiting and len(self.running) < self.config.max_batch_size:
            request = self.waiting[0]
            try:
                request.pages = kv_pages.SequencePages(self.allocator,
                                                       self.worst_case_tokens(request))
            except ValueError:
                return                      # pages free up when running requests finish
            self.waiting.popleft()
            request.state = requests_lib.State.PREFILL
            self.running.append(request)

    def schedule(self, tokens_per_decode: int) -> ScheduledBatch:
        """Fills one iteration's token budget; allocates the prompt chunks' KV pages (the decode
        rows' pages are allocated once their K is final, `Executor._plan`; admission reserved
        them).

        Args:
          tokens_per_decode: 1 + K, the placeholder size of every decoding request.
        """
        self._admit()
        budget = self.config.max_num_tokens
        decode = []
        for r in self.running:
            if r.state is requests_lib.State.DECODE and budget >= tokens_per_decode:
                decode.append(r)
                budget -= tokens_per_decode
        prefill = []
        for r in self.running:
            if r.state is requests_lib.State.PREFILL and budget > 0:
                length = min(len(r.prompt) - r.num_cached, budget, self.config.prefill_chunk)
                r.pages.ensure(r.num_cached + length)
                prefill.append(Chunk(r, r.num_cached, length))
                budget -= length
        return ScheduledBatch(decode=decode, prefill=prefill)

    def finish(self, request: requests_lib.Request, reason: str):
        request.state = requests_lib.State.FINISHED
        request.finish_reason = request.finish_reason or reason
        if request in self.running:
            self.running.remove(request)
            request.pages.release()
        elif request in self.waiting:
            self.waiting.remove(request)
