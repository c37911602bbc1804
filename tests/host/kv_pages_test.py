"""Page allocator and per-sequence pages: hand-computed cases and a random operation sequence
checked against a brute-force model of the accounting."""

from absl.testing import parameterized
import hypothesis
from hypothesis import strategies as st
import numpy as np
import pytest

from jaxspec.device import kv_cache
from jaxspec.host import kv_pages


class PageAllocatorTest(parameterized.TestCase):

    @parameterized.named_parameters(
        dict(testcase_name="one_page", args=(1, 16), match="num_pages"),
        dict(testcase_name="zero_page_size", args=(8, 0), match="page_size"),
    )
    def test_bad_arguments(self, args, match):
        with pytest.raises(ValueError, match=match):
            kv_pages.PageAllocator(*args)

    def test_pages_for_rounds_up(self):
        alloc = kv_pages.PageAllocator(8, 4)
        assert [alloc.pages_for(n) for n in (0, 1, 4, 5, 8, 9)] == [0, 1, 1, 2, 2, 3]

    def test_hands_out_reserved_pages_from_one_up_never_the_null_page(self):
        alloc = kv_pages.PageAllocator(4, 16)
        assert alloc.num_free == 3
        assert alloc.reserve(3)
        assert alloc.num_free == 0
        assert [alloc.take_reserved() for _ in range(3)] == [1, 2, 3]
        with pytest.raises(RuntimeError, match="without a reservation"):
            alloc.take_reserved()

    def test_refused_reservation_changes_nothing(self):
        alloc = kv_pages.PageAllocator(5, 16)
        assert alloc.reserve(3)
        assert not alloc.reserve(2)
        assert alloc.num_free == 1
        assert alloc.reserve(1)

    def test_unreserve(self):
        alloc = kv_pages.PageAllocator(5, 16)
        alloc.reserve(2)
        alloc.unreserve(1)
        assert alloc.num_free == 3
        with pytest.raises(ValueError, match="only 1 reserved"):
            alloc.unreserve(2)

    @parameterized.named_parameters(
        dict(testcase_name="null_page", page=kv_cache.NULL_PAGE),
        dict(testcase_name="past_the_end", page=5),
        dict(testcase_name="negative", page=-1),
    )
    def test_give_back_refuses_pages_never_handed_out(self, page):
        alloc = kv_pages.PageAllocator(5, 16)
        with pytest.raises(ValueError, match="never handed out"):
            alloc.give_back([page])

    def test_pages_given_back_are_handed_out_again(self):
        alloc = kv_pages.PageAllocator(3, 16)
        alloc.reserve(2)
        a, b = alloc.take_reserved(), alloc.take_reserved()
        alloc.give_back([a, b])
        alloc.reserve(2)
        assert {alloc.take_reserved(), alloc.take_reserved()} == {1, 2}


class SequencePagesTest(parameterized.TestCase):

    def test_reserves_the_worst_case_and_allocates_lazily(self):
        alloc = kv_pages.PageAllocator(10, 4)
        seq = kv_pages.SequencePages(alloc, 13)          # 4 pages promised
        assert (seq.pages, seq.capacity, alloc.num_free) == ([], 0, 5)
        seq.ensure(5)
        assert (seq.pages, seq.capacity, alloc.num_free) == ([1, 2], 8, 5)
        seq.ensure(3)                                    # already there: nothing changes
        assert seq.pages == [1, 2]
        seq.ensure(13)
        assert seq.pages == [1, 2, 3, 4]

    def test_not_enough_free_pages(self):
        alloc = kv_pages.PageAllocator(5, 4)
        kv_pages.SequencePages(alloc, 9)                 # 3 of 4 pages
        with pytest.raises(ValueError, match="not enough free KV pages"):
            kv_pages.SequencePages(alloc, 5)
        assert alloc.num_free == 1

    def test_growth_past_the_reservation_is_refused(self):
        seq = kv_pages.SequencePages(kv_pages.PageAllocator(10, 4), 8)
        with pytest.raises(ValueError, match="more than the 2 pages reserved"):
            seq.ensure(9)
        assert seq.pages == []

    def test_release_returns_pages_and_the_rest_of_the_reservation(self):
        alloc = kv_pages.PageAllocator(10, 4)
        seq = kv_pages.SequencePages(alloc, 30)
        seq.ensure(6)
        seq.release()
        assert (seq.pages, alloc.num_free) == ([], 9)

    def test_table_row(self):
        alloc = kv_pages.PageAllocator(10, 4)
        seq = kv_pages.SequencePages(alloc, 16)
        seq.ensure(9)
        np.testing.assert_array_equal(seq.table_row(5), [1, 2, 3, 0, 0])
        np.testing.assert_array_equal(seq.table_row(2), [1, 2])
        assert seq.table_row(4).dtype == np.int32


# ---------------------------------------------------------------------------- random operations

NUM_PAGES, PAGE_SIZE = 12, 4


@st.composite
def operations(draw):
    ops = []
    for _ in range(draw(st.integers(1, 40))):
        kind = draw(st.sampled_from(["new", "ensure", "release"]))
        ops.append((kind, draw(st.integers(0, 5)), draw(st.integers(0, 30))))
    return ops


@hypothesis.settings(max_examples=150, deadline=None, derandomize=True)
@hypothesis.given(operations())
def test_accounting_matches_a_brute_force_model(ops):
    """Live sequences own disjoint pages; free pages = total - every live reservation; a sequence
    holds exactly the pages its largest `ensure` needs."""
    alloc = kv_pages.PageAllocator(NUM_PAGES, PAGE_SIZE)
    live = []                                   # [sequence, budget pages, expected page count]
    for kind, index, n in ops:
        if kind == "new":
            budget = -(-n // PAGE_SIZE)
            reserved = sum(b for _, b, _ in live)
            if budget > NUM_PAGES - 1 - reserved:
                with pytest.raises(ValueError):
                    kv_pages.SequencePages(alloc, n)
            else:
                live.append([kv_pages.SequencePages(alloc, n), budget, 0])
        elif live:
            entry = live[index % len(live)]
            seq, budget, held = entry
            pages = -(-n // PAGE_SIZE)
            if kind == "ensure" and pages > budget:
                with pytest.raises(ValueError):
                    seq.ensure(n)
            elif kind == "ensure":
                seq.ensure(n)
                entry[2] = max(held, pages)
            else:
                seq.release()
                live.remove(entry)
        owned = [p for seq, _, _ in live for p in seq.pages]
        assert len(owned) == len(set(owned))
        assert all(0 < p < NUM_PAGES for p in owned)
        assert [len(seq.pages) for seq, _, _ in live] == [held for _, _, held in live]
        assert alloc.num_free == NUM_PAGES - 1 - sum(b for _, b, _ in live)
