"""SAManager: slot policy, retention, dummy rows, capacity errors, and drafts against the oracle."""

from absl.testing import absltest
from absl.testing import parameterized
import hypothesis
from hypothesis import strategies as st
import numpy as np

import jaxspec as js
from jaxspec.host import sa_reference

K = 2  # draft length used throughout, so each jitted op compiles once
ROWS = 3


def _step(manager, rows, global_search=False, max_ngram_size=-1):
    """Extends `[(rid, tokens)]` padded to ROWS rows; returns per row `(match_len, draft)`."""
    rows = rows + [(None, [])] * (ROWS - len(rows))
    accepted = np.zeros((ROWS, K + 1), np.int32)
    for b, (_, tokens) in enumerate(rows):
        accepted[b, :len(tokens)] = tokens
    counts = np.asarray([len(t) for _, t in rows], np.int32)
    fn = manager.extend_global if global_search else manager.extend
    match_len, draft = fn([rid for rid, _ in rows], accepted, counts, K,
                          max_ngram_size=max_ngram_size)
    return list(zip(np.asarray(match_len).tolist(), np.asarray(draft).tolist(), strict=True))


class SAManagerTest(parameterized.TestCase):

    def test_slot_policy_free_first_then_oldest_retained(self):
        manager = js.SAManager(max_slots=4, max_seq_len=16, max_num_requests=2,
                               enable_global_pool=True, global_pool_size=4)
        for rid in "ab":
            manager.add_request(rid, [1, 2])
        # TensorRT-LLM hands out free slots from the top.
        np.testing.assert_array_equal(manager.prepare(["a", "b", "x", None]), [3, 2, 4, 4])
        manager.remove_request("a")  # retained: pool 4 > 2 requests
        manager.add_request("c", [1])
        manager.add_request("d", [1])
        manager.remove_request("b")
        np.testing.assert_array_equal(manager.prepare(["c", "d"]), [1, 0])
        manager.add_request("e", [1])  # no free slot: the oldest retained (a's)
        manager.add_request("f", [1])  # then b's
        np.testing.assert_array_equal(manager.prepare(["e", "f"]), [3, 2])
        with self.assertRaisesRegex(RuntimeError, "'g'.*all 4 slots"):
            manager.add_request("g", [1])

    @parameterized.named_parameters(
        dict(testcase_name="no_global_pool", enable=False, pool=None, retained=False),
        dict(testcase_name="pool_equals_requests", enable=True, pool=2, retained=False),
        dict(testcase_name="pool_exceeds_requests", enable=True, pool=3, retained=True),
    )
    def test_retention_needs_global_pool_and_spare_slots(self, enable, pool, retained):
        manager = js.SAManager(max_slots=2, max_seq_len=16, max_num_requests=2,
                               enable_global_pool=enable, global_pool_size=pool)
        manager.add_request("a", [1, 2])
        (slot,) = manager.prepare(["a"])
        manager.remove_request("a")
        manager.prepare([])
        self.assertEqual(bool(manager.active_mask[slot]), retained)
        manager.add_request("b", [1])
        (new_slot,) = manager.prepare(["b"])
        self.assertEqual(new_slot != slot, retained)  # a freed slot is reused at once

    def test_request_removed_before_reaching_the_device_is_not_retained(self):
        manager = js.SAManager(max_slots=2, max_seq_len=16, max_num_requests=1,
                               enable_global_pool=True, global_pool_size=2)
        manager.add_request("a", [1, 2])
        manager.remove_request("a")  # never prepared
        manager.prepare([])
        self.assertFalse(np.asarray(manager.active_mask).any())
        manager.add_request("b", [1])
        np.testing.assert_array_equal(manager.prepare(["b"]), [1])  # a's slot was freed

    def test_unknown_and_removed_ids_map_to_the_dummy_slot(self):
        manager = js.SAManager(max_slots=2, max_seq_len=16, max_num_requests=2)
        manager.add_request(7, [1, 2, 1])
        manager.remove_request(7)
        manager.remove_request(7)  # idempotent
        np.testing.assert_array_equal(manager.prepare([7, "x", None]), [2, 2, 2])
        self.assertEqual(_step(manager, [(7, [2]), ("x", [1])]), [(0, [0, 0])] * ROWS)

    def test_drafts_and_rebuild(self):
        manager = js.SAManager(max_slots=3, max_seq_len=32, max_num_requests=3)
        manager.add_request("a", [1, 2, 3])
        manager.add_request("b", [4, 4])
        self.assertEqual(_step(manager, [("a", [1, 2]), ("b", [])]),
                         [(2, [3, 1]), (1, [4, 0]), (0, [0, 0])])
        self.assertEqual(_step(manager, [("a", [3])], max_ngram_size=2), [(2, [1, 2])]
                         + [(0, [0, 0])] * 2)
        manager.add_request("a", [5, 6, 5])  # a known id is rebuilt from the given tokens
        self.assertEqual(manager.remaining("a"), 29)
        self.assertEqual(_step(manager, [("a", [6])])[0], (2, [5, 6]))

    def test_global_search_reads_retained_slots(self):
        manager = js.SAManager(max_slots=2, max_seq_len=32, max_num_requests=2,
                               enable_global_pool=True, global_pool_size=3)
        manager.add_request("old", [7, 8, 9, 10])
        manager.prepare(["old"])
        manager.remove_request("old")
        manager.add_request("new", [1, 7, 8])
        self.assertEqual(_step(manager, [("new", [])], global_search=True)[0], (2, [9, 10]))
        with self.assertRaisesRegex(ValueError, "enable_global_pool"):
            _step(js.SAManager(1, 8, 1), [], global_search=True)

    def test_refuses_sequences_that_outgrow_max_seq_len(self):
        manager = js.SAManager(max_slots=2, max_seq_len=6, max_num_requests=2)
        with self.assertRaisesRegex(ValueError, "'long'.*7 tokens exceed max_seq_len=6"):
            manager.add_request("long", [1] * 7)
        manager.add_request("a", [1, 2, 1, 2])
        self.assertEqual(manager.remaining("a"), 2)
        before = np.asarray(manager.state.text).copy()
        with self.assertRaisesRegex(ValueError, "'a' would grow to 7 tokens"):
            _step(manager, [("a", [1, 2, 1])])
        self.assertEqual(manager.remaining("a"), 2)
        np.testing.assert_array_equal(manager.state.text, before)
        _step(manager, [("a", [1, 2])])
        self.assertEqual(manager.remaining("a"), 0)
        with self.assertRaisesRegex(ValueError, "'a' would grow to 7"):
            manager.advance(["a", None], [1, 5])
        with self.assertRaisesRegex(ValueError, "unknown request 'zz'"):
            manager.remaining("zz")

    @parameterized.named_parameters(
        dict(testcase_name="pool_below_requests", kwargs=dict(max_slots=2, max_seq_len=8,
                                                               max_num_requests=3),
             match="pool size 2 .* max_num_requests 3"),
        dict(testcase_name="global_pool_below_requests",
             kwargs=dict(max_slots=8, max_seq_len=8, max_num_requests=3,
                         enable_global_pool=True, global_pool_size=2),
             match="pool size 2"),
        dict(testcase_name="max_slots", kwargs=dict(max_slots=0, max_seq_len=8,
                                                     max_num_requests=1),
             match="max_slots must be a positive int, got 0"),
        dict(testcase_name="global_pool_size", kwargs=dict(max_slots=1, max_seq_len=8,
                                                            max_num_requests=1,
                                                            global_pool_size=-3),
             match="-3"),
    )
    def test_bad_construction(self, kwargs, match):
        with self.assertRaisesRegex(ValueError, match):
            js.SAManager(**kwargs)

    def test_default_global_pool_size(self):
        self.assertEqual(js.SAManager(4, 8, 4, enable_global_pool=True).num_slots, 64)
        self.assertEqual(js.SAManager(4, 8, 4).num_slots, 4)

    def test_bad_batches(self):
        manager = js.SAManager(max_slots=2, max_seq_len=8, max_num_requests=2)
        manager.add_request("a", [1])
        with self.assertRaisesRegex(ValueError, "twice"):
            manager.extend(["a", "a"], np.zeros((2, 3), np.int32), np.ones(2, np.int32), 2)
        with self.assertRaisesRegex(ValueError, r"\[0, 3\]"):
            manager.extend(["a"], np.zeros((1, 3), np.int32), np.array([4]), 2)
        with self.assertRaisesRegex(ValueError, r"accepted \[1, K\+1\]"):
            manager.extend(["a"], np.zeros(3, np.int32), np.array([1]), 2)

    @hypothesis.given(data=st.data())
    @hypothesis.settings(max_examples=15, deadline=None, derandomize=True)
    def test_global_lifecycle_equals_oracle(self, data):
        # Random adds, removals and steps; the oracle searches every slot that holds a live or
        # retained request's text, with the manager's slot numbering (it breaks ties).
        pool = 5
        manager = js.SAManager(max_slots=3, max_seq_len=40, max_num_requests=ROWS,
                               enable_global_pool=True, global_pool_size=pool)
        live, slot_text = {}, {}
        tokens = st.lists(st.integers(0, 2), max_size=K + 1)
        for step in range(data.draw(st.integers(1, 6))):
            if len(live) < ROWS and data.draw(st.booleans()):
                rid = f"r{step}"
                text = data.draw(st.lists(st.integers(0, 2), max_size=8))
                manager.add_request(rid, text)
                (slot,) = manager.prepare([rid])
                live[rid], slot_text[slot] = slot, text  # a recycled retained slot is replaced
            if live and data.draw(st.booleans()):
                # Flushed to the device above, so retained: its text stays searchable.
                manager.remove_request(live.pop(data.draw(st.sampled_from(sorted(live)))))
            rows = [(rid, data.draw(tokens)) for rid in sorted(live)]
            for rid, chunk in rows:
                slot_text[live[rid]] += chunk
            got = _step(manager, rows, global_search=True)
            texts = [slot_text.get(slot, []) for slot in range(pool + 1)]
            active = [slot in slot_text for slot in range(pool + 1)]
            for (rid, _), (match_len, draft) in zip(rows, got, strict=False):
                expected = sa_reference.naive_global_draft(texts, live[rid], active, K)
                self.assertEqual((match_len, draft[:len(expected[1])]), expected)
                self.assertFalse(any(draft[len(expected[1]):]))

if __name__ == "__main__":
    absltest.main()
