"""Drafter base class: batch gate, schedule, padding, and the documented user-defined drafter."""

import dataclasses
import textwrap

from absl.testing import absltest
from absl.testing import parameterized
import numpy as np

from jaxspec.host import drafter as drafter_lib
from jaxspec.host.drafter import Drafter
from jaxspec.host.drafter import pad_drafts


@dataclasses.dataclass
class Request:
    request_id: int
    tokens: list[int]
    max_sequence_length: int


class EmptyDrafter(Drafter):
    """The smallest concrete drafter: the base class's rules are what is under test."""

    def prepare_draft_tokens(self, requests):
        return [[] for _ in requests]


def documented_example():
    """Executes the example drafter of the module docstring and returns its namespace."""
    doc = drafter_lib.__doc__
    block = doc.split("::\n", 1)[1].split("\n\n``room``", 1)[0]
    namespace = {"Drafter": Drafter}
    exec(textwrap.dedent(block), namespace)
    return namespace


class ShouldUseSpecDecodeTest(parameterized.TestCase):

    @parameterized.named_parameters(
        dict(testcase_name="below_limit", num_requests=3, expected=True),
        dict(testcase_name="exactly_at_limit", num_requests=4, expected=True),
        dict(testcase_name="above_limit", num_requests=5, expected=False),
        dict(testcase_name="no_requests", num_requests=0, expected=False),
    )
    def test_max_concurrency_is_inclusive(self, num_requests, expected):
        drafter = EmptyDrafter(4, max_concurrency=4)
        self.assertEqual(drafter.should_use_spec_decode(num_requests, 64, 8192, 4), expected)

    def test_batch_capacity_caps_the_effective_batch(self):
        drafter = EmptyDrafter(4, max_concurrency=4)
        self.assertTrue(drafter.should_use_spec_decode(100, 4, 8192, 4))
        self.assertFalse(drafter.should_use_spec_decode(100, 5, 8192, 4))

    def test_token_budget_caps_the_effective_batch(self):
        drafter = EmptyDrafter(4, max_concurrency=4)
        # 100 requests, but 20 // (1 + 4) = 4 of them fit the token budget: speculate.
        self.assertTrue(drafter.should_use_spec_decode(100, 64, 20, 4))
        self.assertFalse(drafter.should_use_spec_decode(100, 64, 25, 4))

    @parameterized.named_parameters(
        dict(testcase_name="budget_below_one_plus_k", args=(1, 8, 4, 4)),
        dict(testcase_name="zero_budget", args=(1, 8, 0, 4)),
        dict(testcase_name="zero_batch", args=(1, 0, 8192, 4)),
        dict(testcase_name="no_requests", args=(0, 8, 8192, 4)),
    )
    def test_no_capacity_is_false_with_or_without_limit(self, args):
        self.assertFalse(EmptyDrafter(4).should_use_spec_decode(*args))
        self.assertFalse(EmptyDrafter(4, max_concurrency=8).should_use_spec_decode(*args))

    def test_budget_exactly_one_plus_k(self):
        self.assertTrue(EmptyDrafter(4, max_concurrency=8).should_use_spec_decode(3, 8, 5, 4))

    def test_no_limit_speculates_whenever_there_is_capacity(self):
        drafter = EmptyDrafter(4)
        self.assertTrue(drafter.should_use_spec_decode(1000, 1000, 5000, 4))

    def test_general_schedule_uses_its_value_at_the_effective_batch(self):
        drafter = EmptyDrafter(4, draft_len_schedule={2: 4, 6: 1, 10: 0})
        self.assertTrue(drafter.should_use_spec_decode(6, 64, 8192, 1))
        self.assertFalse(drafter.should_use_spec_decode(7, 64, 8192, 1))
        self.assertFalse(drafter.should_use_spec_decode(11, 64, 8192, 1))
        # 7 requests, but only 12 // (1 + 1) = 6 fit the budget.
        self.assertTrue(drafter.should_use_spec_decode(7, 64, 12, 1))

    def test_negative_draft_tokens_raise(self):
        with self.assertRaisesRegex(ValueError, "max_total_draft_tokens.*-1"):
            EmptyDrafter(4).should_use_spec_decode(1, 8, 8192, -1)


class DrafterStateTest(parameterized.TestCase):

    def test_construction(self):
        drafter = EmptyDrafter(5, max_concurrency=32)
        self.assertEqual(drafter.max_draft_len, 5)
        self.assertEqual(drafter.draft_len, 5)
        self.assertEqual(drafter.max_concurrency, 32)
        self.assertEqual(drafter.draft_len_schedule, ((32, 5),))

    @parameterized.named_parameters(
        dict(testcase_name="zero_len", kw=dict(max_draft_len=0), match="max_draft_len.*0"),
        dict(testcase_name="both", kw=dict(max_draft_len=4, max_concurrency=2,
                                           draft_len_schedule={1: 4}), match="mutually exclusive"),
        dict(testcase_name="bad_schedule", kw=dict(max_draft_len=4, draft_len_schedule={1: 3}),
             match="smallest"),
    )
    def test_invalid_construction(self, kw, match):
        with self.assertRaisesRegex(ValueError, match):
            EmptyDrafter(**kw)

    def test_cannot_instantiate_the_abstract_base(self):
        with self.assertRaises(TypeError):
            Drafter(4)

    def test_draft_len_for_batch_size(self):
        drafter = EmptyDrafter(4, draft_len_schedule={4: 4, 8: 2, 32: 1})
        self.assertEqual([drafter.draft_len_for_batch_size(b) for b in (1, 4, 5, 8, 9, 32, 33)],
                         [4, 4, 2, 2, 1, 1, 0])
        self.assertEqual(EmptyDrafter(4).draft_len_for_batch_size(1000), 4)

    def test_update_draft_len(self):
        drafter = EmptyDrafter(4)
        drafter.update_draft_len(0)
        self.assertEqual(drafter.draft_len, 0)
        drafter.update_draft_len(4)
        self.assertEqual(drafter.draft_len, 4)
        for bad in (-1, 5):
            with self.assertRaisesRegex(ValueError, f"draft_len.*got {bad}"):
                drafter.update_draft_len(bad)

    def test_release_of_a_stateless_drafter_is_harmless(self):
        drafter = EmptyDrafter(4)
        drafter.release("never seen")
        self.assertEqual(drafter.prepare_draft_tokens([Request(0, [1], 10)]), [[]])


class PadDraftsTest(parameterized.TestCase):

    def test_docstring_example(self):
        tokens, lengths = pad_drafts([[7, 8], [], [1, 2, 3, 4]], 3)
        np.testing.assert_array_equal(tokens, [[7, 8, 0], [0, 0, 0], [1, 2, 3]])
        np.testing.assert_array_equal(lengths, [2, 0, 3])
        self.assertEqual((tokens.dtype, lengths.dtype), (np.int32, np.int32))

    def test_padding_token_zero_is_not_counted(self):
        tokens, lengths = pad_drafts([[0, 0]], 4)
        np.testing.assert_array_equal(tokens, [[0, 0, 0, 0]])
        np.testing.assert_array_equal(lengths, [2])

    def test_zero_k_and_empty_batch(self):
        tokens, lengths = pad_drafts([[1, 2]], 0)
        self.assertEqual(tokens.shape, (1, 0))
        np.testing.assert_array_equal(lengths, [0])
        tokens, lengths = pad_drafts([], 3)
        self.assertEqual((tokens.shape, lengths.shape), ((0, 3), (0,)))

    def test_negative_k_raises(self):
        with self.assertRaisesRegex(ValueError, "k must be >= 0, got -1"):
            pad_drafts([[1]], -1)


class UserDefinedDrafterTest(parameterized.TestCase):

    def setUp(self):
        super().setUp()
        namespace = documented_example()
        self.cls = namespace["RepeatLastDrafter"]
        self.drafter = namespace["drafter"]

    def test_drafts_the_last_token_within_k_and_the_budget(self):
        requests = [Request(0, [5, 6, 7], 100), Request(1, [9], 3), Request(2, [4], 2)]
        self.assertEqual(self.drafter.prepare_draft_tokens(requests), [[7] * 4, [9], []])
        self.drafter.update_draft_len(2)
        self.assertEqual(self.drafter.prepare_draft_tokens(requests), [[7, 7], [9], []])

    def test_inherits_the_control_plane(self):
        self.assertIsInstance(self.drafter, Drafter)
        self.assertEqual(self.drafter.draft_len_schedule, ((8, 4),))
        self.assertTrue(self.drafter.should_use_spec_decode(8, 64, 8192, 4))
        self.assertFalse(self.drafter.should_use_spec_decode(9, 64, 8192, 4))
        tokens, lengths = pad_drafts(
            self.drafter.prepare_draft_tokens([Request(0, [3], 3), Request(1, [2], 100)]), 4)
        np.testing.assert_array_equal(tokens, [[3, 0, 0, 0], [2, 2, 2, 2]])
        np.testing.assert_array_equal(lengths, [1, 4])


class DrafterGateFieldsTest(parameterized.TestCase):

    def test_no_gate_by_default(self):
        self.assertFalse(EmptyDrafter(max_draft_len=2).gate_enabled)

    @parameterized.named_parameters(
        dict(testcase_name="both", window=4, threshold=0.3, enabled=True),
        dict(testcase_name="window_zero", window=0, threshold=0.3, enabled=False),
        dict(testcase_name="no_threshold", window=4, threshold=None, enabled=False),
    )
    def test_gate_enabled(self, window, threshold, enabled):
        drafter = EmptyDrafter(max_draft_len=2, acceptance_rate_window_size=window,
                               acceptance_rate_threshold=threshold)
        self.assertEqual(drafter.gate_enabled, enabled)

    @parameterized.named_parameters(
        dict(testcase_name="threshold_above_one", window=4, threshold=1.5,
             match="acceptance_rate_threshold"),
        dict(testcase_name="negative_window", window=-1, threshold=0.5,
             match="acceptance_rate_window_size"),
    )
    def test_bad_gate_fields(self, window, threshold, match):
        with self.assertRaisesRegex(ValueError, match):
            EmptyDrafter(max_draft_len=2, acceptance_rate_window_size=window,
                         acceptance_rate_threshold=threshold)


if __name__ == "__main__":
    absltest.main()
