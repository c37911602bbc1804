"""NGramPool and NGramDrafter: hand-computed cases and a brute-force oracle.

The oracle rebuilds the pool from nothing at every call: it replays every earlier call with a full
scan of that call's prefix (no scan positions, no incremental window), storing continuations by the
definition in the module docstring of `jaxspec.host.ngram`. A full scan re-offers continuations
that are already stored, which changes nothing, so the incremental pool must draft exactly the same.
"""

import dataclasses

from absl.testing import absltest
from absl.testing import parameterized
import hypothesis
from hypothesis import strategies as st
import numpy as np

from jaxspec.config import NGramConfig
from jaxspec.host.ngram import NGramDrafter
from jaxspec.host.ngram import NGramPool

FLAGS = dict(is_keep_all=[True, False], is_use_oldest=[True, False], is_public_pool=[True, False])


class OraclePool:
    """The pool's definition, rebuilt from scratch on every call."""

    def __init__(self, max_draft_len, ngram, is_keep_all, is_use_oldest, is_public_pool):
        self.k, self.n = max_draft_len, ngram
        self.keep_all, self.oldest, self.public = is_keep_all, is_use_oldest, is_public_pool
        self.calls = []  # (pool owner, prefix) of every call that updated a pool, in order

    def _add(self, table, pattern, new):
        matches = table.get(pattern)
        if matches is None:
            table[pattern] = [new]
        elif new in matches:
            pass
        elif self.keep_all:
            table[pattern] = [m for m in matches if len(m) >= len(new)] + [new]
        elif len(new) > len(matches[0]):
            table[pattern] = [new]

    def get_draft_tokens(self, prefix, request_id, max_sequence_length):
        room = min(self.k, max_sequence_length - 1 - len(prefix))
        if room <= 0:
            return []
        owner = None if self.public else request_id
        self.calls.append((owner, tuple(prefix)))
        table = {}
        for call_owner, text in self.calls:
            if call_owner != owner:
                continue
            for size in range(min(self.n, len(text) - 1), 0, -1):
                for left in range(len(text) - size):
                    self._add(table, text[left:left + size],
                              text[left + size:left + size + self.k])
        for size in range(min(self.n, len(prefix) - 1), 0, -1):
            matches = table.get(tuple(prefix[-size:]))
            if matches:
                return list((matches[0] if self.oldest else matches[-1])[:room])
        return []

    def release(self, request_id):
        if not self.public:
            self.calls = [call for call in self.calls if call[0] != request_id]


@st.composite
def scenarios(draw, chunked):
    """Requests growing token by token (or in chunks), interleaved, some released and reused."""
    vocab = draw(st.integers(2, 5))
    num_requests = draw(st.integers(1, 3))
    ops = []
    for _ in range(draw(st.integers(1, 30 if chunked else 45))):
        request = draw(st.integers(0, num_requests - 1))
        if draw(st.integers(0, 15)) == 0:
            ops.append(("release", request, None, None))
            continue
        size = draw(st.integers(1, 6)) if chunked else 1
        chunk = draw(st.lists(st.integers(0, vocab - 1), min_size=size, max_size=size))
        room = draw(st.one_of(st.just(1000), st.integers(-1, 4)))
        ops.append(("grow", request, chunk, room))
    return ops


def replay(pool, ops):
    """Applies `ops` to `pool`, drafting after every growth step as the executor would; yields
    (request, text so far, room, draft)."""
    texts = {}
    for kind, request, chunk, room in ops:
        if kind == "release":
            pool.release(request)
            texts.pop(request, None)
            continue
        text = texts.setdefault(request, [])
        text.extend(chunk)
        yield request, list(text), room, pool.get_draft_tokens(list(text), request,
                                                                len(text) + 1 + room)


def run_scenario(pool, ops):
    return [draft for *_, draft in replay(pool, ops)]


def occurs_in(draft, prefix, ngram, histories):
    """Whether `draft` followed some suffix (1..ngram tokens) of `prefix` in one of `histories`."""
    for history in histories:
        for size in range(1, min(ngram, len(prefix) - 1) + 1):
            pattern = list(prefix[-size:])
            for start in range(len(history) - size):
                if (history[start:start + size] == pattern
                        and history[start + size:start + size + len(draft)] == list(draft)):
                    return True
    return False


class NGramPoolOracleTest(parameterized.TestCase):

    @parameterized.product(chunked=[False, True], **FLAGS)
    def test_matches_oracle(self, chunked, **flags):

        @hypothesis.settings(max_examples=40, deadline=None)
        @hypothesis.given(st.integers(1, 4), st.integers(1, 4), scenarios(chunked))
        def check(max_draft_len, ngram, ops):
            pool = NGramPool(max_draft_len, ngram, **flags)
            oracle = OraclePool(max_draft_len, ngram, **flags)
            self.assertEqual(run_scenario(pool, ops), run_scenario(oracle, ops))

        check()

    @parameterized.product(eviction=["lru", "fifo"], is_public_pool=[True, False])
    def test_bounded_pool_drafts_only_real_continuations(self, eviction, is_public_pool):

        @hypothesis.settings(max_examples=25, deadline=None)
        @hypothesis.given(st.integers(1, 4), st.integers(1, 3), st.integers(1, 12),
                          scenarios(chunked=True))
        def check(max_draft_len, ngram, bound, ops):
            pool = NGramPool(max_draft_len, ngram, is_public_pool=is_public_pool,
                             max_pool_entries=bound, eviction=eviction)
            seen = {}
            for request, text, room, draft in replay(pool, ops):
                seen.setdefault(request, []).append(text)
                self.assertLessEqual(len(draft), max(0, min(max_draft_len, room)))
                histories = ([h for hs in seen.values() for h in hs] if is_public_pool
                             else [list(text)])
                if draft:
                    self.assertTrue(occurs_in(draft, text, ngram, histories), (draft, text))
                for table in [pool._public, *pool._private.values()]:
                    self.assertLessEqual(table.num_entries, bound)

        check()


class NGramPoolTest(parameterized.TestCase):

    def test_docstring_example(self):
        pool = NGramPool(2, 2)
        self.assertEqual(pool.get_draft_tokens([1, 2, 3, 1, 2], "a", 100), [3, 1])
        self.assertEqual(pool.num_entries, 7)

    def test_longest_pattern_first(self):
        # (7, 1) -> (5,) beats (1,) -> (2,): the longer suffix decides.
        pool = NGramPool(1, 2)
        self.assertEqual(pool.get_draft_tokens([1, 2, 7, 1, 5, 7, 1], "a", 100), [5])
        self.assertEqual(NGramPool(1, 1).get_draft_tokens([1, 2, 7, 1, 5, 7, 1], "a", 100), [2])

    def test_no_match_and_short_prefixes(self):
        pool = NGramPool(3, 2)
        self.assertEqual(pool.get_draft_tokens([], "a", 100), [])
        self.assertEqual(pool.get_draft_tokens([4], "b", 100), [])
        self.assertEqual(pool.get_draft_tokens([1, 2, 3], "c", 100), [])

    @parameterized.named_parameters(
        dict(testcase_name="oldest", oldest=True, expected=[1, 2]),
        dict(testcase_name="newest", oldest=False, expected=[3, 4]),
    )
    def test_oldest_or_newest(self, oldest, expected):
        pool = NGramPool(2, 1, is_use_oldest=oldest)
        self.assertEqual(pool.get_draft_tokens([9, 1, 2, 9, 3, 4, 9], "a", 100), expected)

    def test_newest_can_be_a_cut_short_continuation(self):
        # (9,) -> [(1, 2), (3,)]: the last occurrence of 9 had one token after it.
        pool = NGramPool(2, 1, is_use_oldest=False)
        self.assertEqual(pool.get_draft_tokens([9, 1, 2, 9, 3], "a", 100), [])
        self.assertEqual(pool.get_draft_tokens([9, 1, 2, 9, 3, 5, 9], "a", 100), [3, 5])

    def test_keep_one_keeps_exactly_one(self):
        # TensorRT-LLM appends the equal-length (3, 4) and drafts it as the newest; we keep one.
        pool = NGramPool(2, 1, is_keep_all=False, is_use_oldest=False)
        self.assertEqual(pool.get_draft_tokens([9, 1, 2, 9, 3, 4, 9], "a", 100), [1, 2])

    def test_keep_one_replaced_by_a_longer_continuation(self):
        pool = NGramPool(2, 1, is_keep_all=False)
        self.assertEqual(pool.get_draft_tokens([5, 9, 1], "a", 100), [])  # (9,) -> (1,)
        self.assertEqual(pool.get_draft_tokens([5, 9, 1, 7], "a", 100), [])  # (9,) -> (1, 7)
        self.assertEqual(pool.get_draft_tokens([5, 9, 1, 7, 9], "a", 100), [1, 7])

    def test_longer_continuation_drops_every_shorter_one(self):
        # Under K=2, (9,) -> [(1, 2), (3, 4)]. With K=3, (5, 6, 7) drops both; TensorRT-LLM's
        # delete-while-iterating keeps (3, 4).
        pool = NGramPool(2, 1)
        pool.get_draft_tokens([9, 1, 2, 9, 3, 4], "a", 100)
        pool.max_draft_len = 3
        pool.get_draft_tokens([9, 1, 2, 9, 3, 4, 9, 5, 6, 7], "a", 100)
        self.assertEqual(pool.get_draft_tokens([9, 1, 2, 9, 3, 4, 9, 5, 6, 7, 9], "a", 100),
                         [5, 6, 7])

    def test_drafts_never_exceed_the_current_k(self):
        pool = NGramPool(4, 1)
        self.assertEqual(pool.get_draft_tokens([9, 1, 2, 3, 4, 9], "a", 100), [1, 2, 3, 4])
        pool.max_draft_len = 2
        self.assertEqual(pool.get_draft_tokens([9, 1, 2, 3, 4, 9, 1, 2, 3, 4, 9], "a", 100),
                         [1, 2])

    def test_k_zero_drafts_nothing_and_stores_nothing(self):
        pool = NGramPool(2, 1)
        pool.max_draft_len = 0
        self.assertEqual(pool.get_draft_tokens([9, 1, 2, 9], "a", 100), [])
        self.assertEqual(pool.num_entries, 0)
        pool.max_draft_len = 2
        self.assertEqual(pool.get_draft_tokens([9, 1, 2, 9], "a", 100), [1, 2])

    @parameterized.named_parameters(
        dict(testcase_name="plenty", max_sequence_length=100, expected=[1, 2, 3]),
        dict(testcase_name="two_left", max_sequence_length=8, expected=[1, 2]),
        dict(testcase_name="one_left", max_sequence_length=7, expected=[1]),
    )
    def test_remaining_length_caps_the_draft(self, max_sequence_length, expected):
        pool = NGramPool(3, 1)
        self.assertEqual(pool.get_draft_tokens([9, 1, 2, 3, 9], "a", max_sequence_length),
                         expected)

    def test_no_room_leaves_the_pool_untouched(self):
        # Only the bonus token fits: nothing to draft, nothing scanned (TensorRT-LLM's behaviour).
        pool = NGramPool(3, 1)
        self.assertEqual(pool.get_draft_tokens([9, 1, 2, 3, 9], "a", 6), [])
        self.assertEqual(pool.num_entries, 0)

    def test_lazy_first_scan_then_window(self):
        pool = NGramPool(2, 2)
        text = [1, 2, 3, 4, 5, 6, 7, 8]
        pool.get_draft_tokens(text, "a", 100)
        self.assertEqual(pool._scan["a"], (8 - (2 + 2 - 1), 8))
        self.assertEqual(pool.get_draft_tokens([*text, 1, 2], "a", 100), [3, 4])
        self.assertEqual(pool._scan["a"], (10 - 3, 10))

    def test_public_pool_shares_text_across_requests(self):
        pool = NGramPool(3, 2)
        pool.get_draft_tokens([5, 6, 7, 8, 9], "a", 100)
        self.assertEqual(pool.get_draft_tokens([1, 5, 6], "b", 100), [7, 8, 9])
        pool.release("a")
        self.assertEqual(pool.get_draft_tokens([1, 5, 6, 1, 6], "b", 100), [7, 8, 9])

    def test_private_pools_are_separate_and_released(self):
        pool = NGramPool(3, 2, is_public_pool=False)
        pool.get_draft_tokens([5, 6, 7, 8, 9], "a", 100)
        self.assertEqual(pool.get_draft_tokens([1, 5, 6], "b", 100), [])
        entries_a = NGramPool(3, 2)
        entries_a.get_draft_tokens([5, 6, 7, 8, 9], "a", 100)
        self.assertGreater(pool.num_entries, entries_a.num_entries)
        pool.release("a")
        pool.release("b")
        self.assertEqual(pool.num_entries, 0)
        pool.release("never seen")

    def test_released_id_can_be_reused_with_a_new_text(self):
        pool = NGramPool(2, 1, is_public_pool=False)
        pool.get_draft_tokens([9, 1, 2, 3, 4, 5], "a", 100)
        with self.assertRaisesRegex(ValueError, "'a'.*shrank from 6 to 3"):
            pool.get_draft_tokens([9, 3, 9], "a", 100)
        pool.release("a")
        self.assertEqual(pool.get_draft_tokens([9, 3, 9], "a", 100), [3, 9])

    def test_accepts_tuples_and_numpy(self):
        text = [1, 2, 3, 1, 2]
        for prefix in (tuple(text), np.array(text, np.int32)):
            draft = NGramPool(2, 2).get_draft_tokens(prefix, "a", 100)
            self.assertEqual(draft, [3, 1])
            self.assertTrue(all(type(t) is int for t in draft))

    @parameterized.named_parameters(
        dict(testcase_name="lru", eviction="lru", drafts=([2], [], [2])),
        dict(testcase_name="fifo", eviction="fifo", drafts=([2], [3], [])),
    )
    def test_eviction_order(self, eviction, drafts):
        pool = NGramPool(1, 1, max_pool_entries=3, eviction=eviction)
        self.assertEqual(pool.get_draft_tokens([1, 2, 3], "a", 100), [])  # (1,) (2,) stored
        # (5,) stored: 3 entries. The lookup of (1,) makes it the most recently used.
        self.assertEqual(pool.get_draft_tokens([5, 1], "b", 100), drafts[0])
        # (6,) makes 4: LRU evicts (2,), the least recently used; FIFO evicts (1,), the first in.
        self.assertEqual(pool.get_draft_tokens([6, 2], "c", 100), drafts[1])
        # (8,) makes 4 again: LRU evicts (5,); FIFO evicts (2,).
        self.assertEqual(pool.get_draft_tokens([8, 1], "d", 100), drafts[2])
        self.assertEqual(pool.num_entries, 3)

    def test_bound_counts_continuations_not_patterns(self):
        pool = NGramPool(1, 1, max_pool_entries=2, eviction="fifo")
        pool.get_draft_tokens([9, 1, 9, 2], "a", 100)  # (9,) -> [(1,), (2,)], (1,) -> [(9,)]
        self.assertEqual(pool.num_entries, 1)  # 3 > 2: (9,) went first, with both its entries

    @parameterized.named_parameters(
        dict(testcase_name="ngram_zero", args=(2, 0), kw={}, match="max_matching_ngram_size.*0"),
        dict(testcase_name="k_negative", args=(-1, 2), kw={}, match="max_draft_len.*-1"),
        dict(testcase_name="bound_zero", args=(2, 2), kw=dict(max_pool_entries=0),
             match="max_pool_entries.*0"),
        dict(testcase_name="eviction", args=(2, 2), kw=dict(eviction="random"),
             match="eviction.*'random'"),
    )
    def test_invalid_arguments(self, args, kw, match):
        with self.assertRaisesRegex(ValueError, match):
            NGramPool(*args, **kw)


@dataclasses.dataclass
class Request:
    request_id: str
    tokens: list[int]
    max_sequence_length: int


class NGramDrafterTest(parameterized.TestCase):

    def test_drafts_per_request_in_order(self):
        drafter = NGramDrafter(NGramConfig(max_draft_len=3, max_matching_ngram_size=2))
        requests = [Request("a", [5, 6, 7, 8, 9], 100), Request("b", [1, 5, 6], 100),
                    Request("c", [4], 100)]
        self.assertEqual(drafter.prepare_draft_tokens(requests), [[], [7, 8, 9], []])

    def test_config_reaches_the_pool_and_the_base(self):
        config = NGramConfig(max_draft_len=4, max_matching_ngram_size=3, is_keep_all=False,
                             is_use_oldest=False, is_public_pool=False, max_concurrency=8)
        drafter = NGramDrafter(config, max_pool_entries=10, eviction="fifo")
        pool = drafter.pool
        self.assertEqual((pool.max_draft_len, pool.max_matching_ngram_size, pool.is_keep_all,
                          pool.is_use_oldest, pool.is_public_pool, pool.max_pool_entries,
                          pool.eviction), (4, 3, False, False, False, 10, "fifo"))
        self.assertEqual(drafter.draft_len_schedule, ((8, 4),))
        self.assertTrue(drafter.should_use_spec_decode(8, 64, 8192, 4))
        self.assertFalse(drafter.should_use_spec_decode(9, 64, 8192, 4))

    def test_update_draft_len_cuts_drafts_not_what_the_pool_stores(self):
        drafter = NGramDrafter(NGramConfig(max_draft_len=4, max_matching_ngram_size=1))
        request = Request("a", [9, 1, 2, 3, 4, 9], 100)
        self.assertEqual(drafter.prepare_drafts([request]), ([[1, 2, 3, 4]], [1]))
        drafter.update_draft_len(2)
        self.assertEqual(drafter.pool.max_draft_len, 4)
        self.assertEqual(drafter.prepare_draft_tokens([request]), [[1, 2]])
        drafter.update_draft_len(0)
        self.assertEqual(drafter.prepare_drafts([request]), ([[]], [0]))

    def test_no_stale_continuations_after_a_small_k(self):
        """TensorRT-LLM stores continuations at the runtime K: text seen while K was 1 drafts
        1 token for good. Here it was stored at max_draft_len, so K = 4 drafts 4 again."""
        drafter = NGramDrafter(NGramConfig(max_draft_len=4, max_matching_ngram_size=2))
        drafter.update_draft_len(1)
        text = [7, 8, 1, 2, 3, 4, 5, 6]
        self.assertEqual(drafter.prepare_draft_tokens([Request("a", text, 100)]), [[]])
        drafter.update_draft_len(4)
        again = Request("a", text + [9, 7, 8], 100)
        self.assertEqual(drafter.prepare_drafts([again]), ([[1, 2, 3, 4]], [2]))

    def test_release_frees_private_pools(self):
        drafter = NGramDrafter(NGramConfig(max_draft_len=2, is_public_pool=False))
        drafter.prepare_draft_tokens([Request("a", [1, 2, 3, 1], 100)])
        self.assertGreater(drafter.pool.num_entries, 0)
        drafter.release("a")
        self.assertEqual(drafter.pool.num_entries, 0)


if __name__ == "__main__":
    absltest.main()
