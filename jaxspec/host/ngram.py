"""The host n-gram pool: draft what followed the current suffix earlier in the text.

Vocabulary: a *pattern* is a tuple of 1..N consecutive tokens (N = ``max_matching_ngram_size``); a
*continuation* (a *match*) is the tuple of up to K tokens that followed one occurrence of it
(K = ``max_draft_len``, fewer where the text ended). The pool maps each pattern to its
continuations, kept in insertion order.

Each `NGramPool.get_draft_tokens` call does TensorRT-LLM's two passes (trtllm-semantics §3.3):

1. *Update.* Scan the request's window ``prefix[start:]``: every pattern, longest size first, that
   has at least one following token adds its continuation. The first call scans the whole prefix;
   later calls rescan only the last ``K+N-1`` tokens seen before plus the new ones, because only
   continuations that started there can have been cut short by the end of the text.
2. *Lookup.* The longest suffix of the prefix (N..1 tokens) that is a known pattern drafts its
   oldest (or newest) continuation, cut to the tokens the request may still generate.

Worked example, N=2, K=2, prefix ``[1, 2, 3, 1, 2]``: the update stores
``(1, 2) -> [(3, 1)]``, ``(2, 3) -> [(1, 2)]``, ``(3, 1) -> [(2,)]``, ``(1,) -> [(2, 3), (2,)]``,
``(2,) -> [(3, 1)]``, ``(3,) -> [(1, 2)]``; the lookup finds the suffix ``(1, 2)`` and drafts
``[3, 1]``.

Adding a continuation that is not yet stored for its pattern:

* keep-all: drop every stored continuation strictly shorter than the new one (a longer view of a
  cut-short match supersedes it), then append. Stored lengths therefore never increase along the
  insertion order, and the shorter ones are always the tail.
* keep-one: keep exactly one continuation per pattern, the longest seen; a strictly longer one
  replaces it, ties keep the older.

Where jaxspec differs from TensorRT-LLM (DESIGN §3): the drop removes *all* shorter continuations
(TensorRT-LLM skips some while deleting during iteration); keep-one really keeps one (TensorRT-LLM
appends equal or shorter ones); drafts never exceed the current K, even when older continuations
were stored under a larger K; and every pool is bounded (see `NGramPool`), where TensorRT-LLM's
public pool grows forever. `NGramDrafter` stores continuations at the config's `max_draft_len`
and cuts drafts to the runtime K at lookup: TensorRT-LLM stores them at the runtime K, so after a
stretch of small K (a large batch) its drafts stay short once K grows back.
"""

import collections
from collections.abc import Hashable
from collections.abc import Sequence

from jaxspec._validate import check_int
from jaxspec.config import NGramConfig
from jaxspec.host.drafter import Drafter
from jaxspec.host.drafter import DraftRequest

# A pool holds at most this many continuations (pattern -> continuation pairs). A token position
# adds at most N of them, fewer where text repeats (0.8 per byte of stdlib source at N=3, K=5), so
# the default holds about a million tokens of history in ~140 MB (~134 bytes per continuation).
DEFAULT_MAX_POOL_ENTRIES = 1 << 20
EVICTION_POLICIES = ("lru", "fifo")


class _PatternTable:
    """pattern -> ordered continuations, bounded by a total number of continuations.

    When an update leaves more than `max_entries` continuations, whole patterns are evicted, least
    recently used first ("lru": a pattern is used when the text shows it again or a lookup hits it)
    or oldest inserted first ("fifo").
    """

    __slots__ = ("keep_all", "lru", "max_entries", "num_entries", "patterns")

    def __init__(self, keep_all: bool, max_entries: int, lru: bool):
        # Values are dicts used as ordered sets: insertion order is the match order.
        self.patterns: collections.OrderedDict[tuple, dict[tuple, None]] = (
            collections.OrderedDict())
        self.num_entries = 0
        self.keep_all = keep_all
        self.max_entries = max_entries
        self.lru = lru

    def absorb(self, window: list[int], max_size: int, draft_len: int) -> None:
        """Adds the continuation of every pattern in `window` that is followed by a token."""
        patterns, keep_all, lru = self.patterns, self.keep_all, self.lru
        touch = patterns.move_to_end
        length = len(window)
        added = 0
        for size in range(max_size, 0, -1):
            for left in range(length - size):
                middle = left + size
                pattern = tuple(window[left:middle])
                new = tuple(window[middle:middle + draft_len])
                matches = patterns.get(pattern)
                if matches is None:
                    patterns[pattern] = {new: None}
                    added += 1
                    continue
                if lru:
                    touch(pattern)
                if new in matches:
                    continue
                if keep_all:
                    while len(last := next(reversed(matches))) < len(new):
                        del matches[last]
                        added -= 1
                        if not matches:
                            break
                    matches[new] = None
                    added += 1
                elif len(new) > len(next(iter(matches))):
                    patterns[pattern] = {new: None}
        self.num_entries += added
        while self.num_entries > self.max_entries:
            _, evicted = patterns.popitem(last=False)
            self.num_entries -= len(evicted)

    def find(self, pattern: tuple, oldest: bool) -> tuple | None:
        matches = self.patterns.get(pattern)
        if matches is None:
            return None
        if self.lru:
            self.patterns.move_to_end(pattern)
        return next(iter(matches)) if oldest else next(reversed(matches))


class NGramPool:
    """Pattern -> continuations pool drafting for many requests (TensorRT-LLM ``NGramPoolManager``).

    A request's `prefix` must only grow between calls; `release` its id when it finishes, which
    frees its private pool and its scan position.

    Args:
      max_draft_len: K, the longest continuation stored and drafted; settable between calls (the
        draft-length schedule changes it). 0 drafts nothing and leaves the pool untouched.
      max_matching_ngram_size: N, the longest pattern, >= 1.
      is_keep_all: keep all continuations per pattern, or only the longest one.
      is_use_oldest: draft the oldest stored continuation, or the newest.
      is_public_pool: one pool shared by every request, or one per request.
      max_pool_entries: bound on the continuations one pool holds (the public pool, or each private
        pool), so a long-running server stays bounded.
      eviction: "lru" or "fifo", which patterns go first when a pool is over its bound.

    Raises:
      ValueError: an invalid size, bound or eviction policy.
    """

    def __init__(
        self,
        max_draft_len: int,
        max_matching_ngram_size: int,
        is_keep_all: bool = True,
        is_use_oldest: bool = True,
        is_public_pool: bool = True,
        *,
        max_pool_entries: int = DEFAULT_MAX_POOL_ENTRIES,
        eviction: str = "lru",
    ):
        self.max_draft_len = max_draft_len
        self.max_matching_ngram_size = check_int("max_matching_ngram_size",
                                                 max_matching_ngram_size, minimum=1)
        self.is_keep_all = bool(is_keep_all)
        self.is_use_oldest = bool(is_use_oldest)
        self.is_public_pool = bool(is_public_pool)
        self.max_pool_entries = check_int("max_pool_entries", max_pool_entries, minimum=1)
        if eviction not in EVICTION_POLICIES:
            raise ValueError(f"eviction must be one of {EVICTION_POLICIES}, got {eviction!r}")
        self.eviction = eviction
        # request id -> (scan start, prefix length at the last scan)
        self._scan: dict[Hashable, tuple[int, int]] = {}
        self._public = self._new_table()
        self._private: dict[Hashable, _PatternTable] = {}

    @property
    def max_draft_len(self) -> int:
        return self._max_draft_len

    @max_draft_len.setter
    def max_draft_len(self, value: int) -> None:
        self._max_draft_len = check_int("max_draft_len", value, minimum=0)

    @property
    def num_entries(self) -> int:
        """Continuations held by all pools together."""
        return self._public.num_entries + sum(t.num_entries for t in self._private.values())

    def _new_table(self) -> _PatternTable:
        return _PatternTable(self.is_keep_all, self.max_pool_entries, self.eviction == "lru")

    def get_draft_tokens(
        self, prefix: Sequence[int], request_id: Hashable, max_sequence_length: int
    ) -> list[int]:
        """Updates the pool with `prefix` and drafts its continuation.

        Args:
          prefix: the request's prompt plus every token generated so far.
          request_id: the request's id; its scan position (and private pool) is keyed by it.
          max_sequence_length: prompt length plus max_new_tokens; drafts never run past
            ``max_sequence_length - 1 - len(prefix)`` tokens, the room left beside the bonus token.

        Returns:
          0..K draft tokens; empty when nothing matched, when there is no room left (then the pool
          is not updated either, as in TensorRT-LLM), or when K is 0.

        Raises:
          ValueError: `prefix` is shorter than at the request's previous call.
        """
        return self.draft(prefix, request_id, max_sequence_length)[0]

    def draft(self, prefix: Sequence[int], request_id: Hashable, max_sequence_length: int,
              cap: int | None = None) -> tuple[list[int], int]:
        """`get_draft_tokens`, with the size of the pattern that matched (0 when none did).

        Args:
          cap: cuts the draft to this many tokens (default `max_draft_len`); continuations are
            stored at `max_draft_len` whatever it is.
        """
        length = len(prefix)
        draft_len = self._max_draft_len
        room = min(draft_len if cap is None else min(cap, draft_len),
                   max_sequence_length - 1 - length)
        if room <= 0:
            return [], 0
        start, seen = self._scan.get(request_id, (0, 0))
        if length < seen:
            raise ValueError(f"request {request_id!r}: prefix shrank from {seen} to {length} "
                             f"tokens; release() the id before reusing it")
        if self.is_public_pool:
            table = self._public
        else:
            table = self._private.get(request_id)
            if table is None:
                table = self._private[request_id] = self._new_table()
        window = prefix[start:]
        if not isinstance(window, list):  # tuples, numpy arrays: scan plain Python ints
            window = window.tolist() if hasattr(window, "tolist") else list(window)
        ngram = self.max_matching_ngram_size
        max_size = min(ngram, length - 1)
        table.absorb(window, max_size, draft_len)
        # Continuations starting in the last K+N-1 tokens may still be cut short by the text's end.
        self._scan[request_id] = (max(0, length - (draft_len + ngram - 1)), length)
        for size in range(max_size, 0, -1):
            match = table.find(tuple(window[-size:]), self.is_use_oldest)
            if match is not None:
                return list(match[:room]), size
        return [], 0

    def release(self, request_id: Hashable) -> None:
        """Forgets a request's scan position and frees its private pool; unknown ids are ignored."""
        self._scan.pop(request_id, None)
        self._private.pop(request_id, None)


class NGramDrafter(Drafter):
    """A `Drafter` over an `NGramPool`, configured by an `NGramConfig`.

    Args:
      config: the drafter's config.
      max_pool_entries: see `NGramPool`.
      eviction: see `NGramPool`.
    """

    def __init__(self, config: NGramConfig, *, max_pool_entries: int = DEFAULT_MAX_POOL_ENTRIES,
                 eviction: str = "lru"):
        super().__init__(config.max_draft_len, draft_len_schedule=config.draft_len_schedule,
                         acceptance_rate_window_size=config.acceptance_rate_window_size,
                         acceptance_rate_threshold=config.acceptance_rate_threshold,
                         gate=config.gate)
        self.config = config
        self.pool = NGramPool(
            config.max_draft_len,
            config.max_matching_ngram_size,
            config.is_keep_all,
            config.is_use_oldest,
            config.is_public_pool,
            max_pool_entries=max_pool_entries,
            eviction=eviction,
        )

    def prepare_draft_tokens(self, requests: Sequence[DraftRequest]) -> list[list[int]]:
        """Drafts for `requests` in the given order (a public pool sees earlier requests first)."""
        return self.prepare_drafts(requests)[0]

    def prepare_drafts(self, requests: Sequence[DraftRequest]
                       ) -> tuple[list[list[int]], list[int]]:
        """Drafts of at most the runtime K, and the size of the pattern behind each."""
        found = [self.pool.draft(r.tokens, r.request_id, r.max_sequence_length, self.draft_len)
                 for r in requests]
        return [tokens for tokens, _ in found], [size for _, size in found]

    def release(self, request_id: Hashable) -> None:
        """Frees the request's scan position and private pool."""
        self.pool.release(request_id)
