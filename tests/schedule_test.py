"""Draft-length schedule lookups, validation and compile buckets, with hand-computed cases."""

from absl.testing import absltest
from absl.testing import parameterized
import hypothesis
from hypothesis import strategies as st

from jaxspec import schedule

SCHEDULE = {4: 4, 8: 2, 32: 1}


def brute_force_draft_len(pairs, batch_size, min_draft_len=0):
    """The definition: the value of the smallest key >= batch_size, 0 above every key, floored."""
    covering = [value for key, value in sorted(pairs) if key >= batch_size]
    return max(covering[0] if covering else 0, min_draft_len)


@st.composite
def schedules(draw):
    max_draft_len = draw(st.integers(1, 6))
    keys = sorted(draw(st.sets(st.integers(1, 40), min_size=1, max_size=5)))
    values = [max_draft_len] + [draw(st.integers(0, max_draft_len)) for _ in keys[1:]]
    return dict(zip(keys, values, strict=True)), max_draft_len


class DraftLenForBatchSizeTest(parameterized.TestCase):

    @parameterized.named_parameters(
        dict(testcase_name="zero_uses_first_value", batch_size=0, expected=4),
        dict(testcase_name="one", batch_size=1, expected=4),
        dict(testcase_name="exactly_first_key", batch_size=4, expected=4),
        dict(testcase_name="just_above_first_key", batch_size=5, expected=2),
        dict(testcase_name="exactly_second_key", batch_size=8, expected=2),
        dict(testcase_name="just_above_second_key", batch_size=9, expected=1),
        dict(testcase_name="exactly_largest_key", batch_size=32, expected=1),
        dict(testcase_name="above_largest_key", batch_size=33, expected=0),
        dict(testcase_name="far_above_largest_key", batch_size=4096, expected=0),
    )
    def test_design_example(self, batch_size, expected):
        self.assertEqual(schedule.draft_len_for_batch_size(SCHEDULE, batch_size, 4), expected)

    def test_floor_applies_above_the_largest_key(self):
        self.assertEqual(schedule.draft_len_for_batch_size(SCHEDULE, 33, 4, min_draft_len=1), 1)
        self.assertEqual(schedule.draft_len_for_batch_size(SCHEDULE, 9, 4, min_draft_len=2), 2)
        self.assertEqual(schedule.draft_len_for_batch_size(SCHEDULE, 1, 4, min_draft_len=2), 4)

    def test_no_schedule_is_max_draft_len_unfloored(self):
        self.assertEqual(schedule.draft_len_for_batch_size(None, 4096, 4), 4)
        self.assertEqual(schedule.draft_len_for_batch_size(None, 4096, 4, min_draft_len=1), 4)

    def test_pairs_and_mapping_agree(self):
        pairs = ((32, 1), (4, 4), (8, 2))
        for batch_size in range(0, 40):
            self.assertEqual(schedule.draft_len_for_batch_size(pairs, batch_size, 4),
                             schedule.draft_len_for_batch_size(SCHEDULE, batch_size, 4))

    def test_max_concurrency_translation_is_inclusive(self):
        translated = schedule.normalize_schedule(None, 5, max_concurrency=32)
        self.assertEqual(translated, ((32, 5),))
        self.assertEqual(schedule.draft_len_for_batch_size(translated, 32, 5), 5)
        self.assertEqual(schedule.draft_len_for_batch_size(translated, 33, 5), 0)

    @parameterized.named_parameters(
        dict(testcase_name="negative_batch", args=(SCHEDULE, -1, 4, 0), match="batch_size.*-1"),
        dict(testcase_name="floor_above_max", args=(SCHEDULE, 1, 4, 5), match="min_draft_len.*5"),
        dict(testcase_name="negative_floor", args=(SCHEDULE, 1, 4, -1), match="min_draft_len.*-1"),
        dict(testcase_name="bad_schedule", args=({4: 3}, 1, 4, 0), match="smallest.*4.*got 3"),
    )
    def test_invalid_arguments(self, args, match):
        with self.assertRaisesRegex(ValueError, match):
            schedule.draft_len_for_batch_size(*args)

    @hypothesis.settings(max_examples=100, deadline=None)
    @hypothesis.given(schedules(), st.integers(0, 50), st.integers(0, 6))
    def test_matches_brute_force(self, schedule_and_max, batch_size, min_draft_len):
        pairs, max_draft_len = schedule_and_max
        min_draft_len = min(min_draft_len, max_draft_len)
        self.assertEqual(
            schedule.draft_len_for_batch_size(pairs, batch_size, max_draft_len, min_draft_len),
            brute_force_draft_len(pairs.items(), batch_size, min_draft_len))


class NormalizeScheduleTest(parameterized.TestCase):

    def test_sorted_tuple(self):
        self.assertEqual(schedule.normalize_schedule({32: 1, 4: 4, 8: 2}, 4),
                         ((4, 4), (8, 2), (32, 1)))
        self.assertIsNone(schedule.normalize_schedule(None, 4))

    def test_translation_given_back_is_accepted(self):
        self.assertEqual(schedule.normalize_schedule(((8, 4),), 4, max_concurrency=8), ((8, 4),))

    @parameterized.named_parameters(
        dict(testcase_name="key_zero", value={0: 4}, match="key 0.*>= 1"),
        dict(testcase_name="negative_value", value={1: 4, 8: -1}, match=r"\[8\].*>= 0, got -1"),
        dict(testcase_name="value_above_max", value={1: 4, 8: 5}, match=r"\[8\].*<= 4, got 5"),
        dict(testcase_name="smallest_not_max", value={2: 3, 8: 1}, match="smallest.*2.*got 3"),
        dict(testcase_name="empty", value={}, match="empty"),
        dict(testcase_name="repeated", value=((1, 4), (1, 4)), match="repeats"),
        dict(testcase_name="not_pairs", value=(1, 2), match="map batch sizes"),
        dict(testcase_name="float_key", value={1.5: 4}, match="key 1.5.*int"),
        dict(testcase_name="bool_value", value={1: True}, match=r"\[1\].*int, got True"),
    )
    def test_invalid(self, value, match):
        with self.assertRaisesRegex(ValueError, match):
            schedule.normalize_schedule(value, 4)

    def test_both_given_is_an_error(self):
        with self.assertRaisesRegex(ValueError, "max_concurrency=8.*mutually exclusive"):
            schedule.normalize_schedule({1: 4}, 4, max_concurrency=8)

    def test_invalid_max_concurrency(self):
        with self.assertRaisesRegex(ValueError, "max_concurrency.*>= 1, got 0"):
            schedule.normalize_schedule(None, 4, max_concurrency=0)


class BucketsTest(parameterized.TestCase):

    @parameterized.named_parameters(
        dict(testcase_name="one", max_batch_size=1, sched=None, expected=(1,)),
        dict(testcase_name="power_of_two", max_batch_size=8, sched=None, expected=(1, 2, 4, 8)),
        dict(testcase_name="not_power", max_batch_size=12, sched=None, expected=(1, 2, 4, 8, 12)),
        dict(testcase_name="schedule_keys", max_batch_size=12, sched={3: 4, 8: 2},
             expected=(1, 2, 3, 4, 8, 12)),
        dict(testcase_name="keys_above_max_ignored", max_batch_size=12, sched={5: 4, 32: 1},
             expected=(1, 2, 4, 5, 8, 12)),
        dict(testcase_name="pairs", max_batch_size=6, sched=((3, 2),), expected=(1, 2, 3, 4, 6)),
    )
    def test_batch_buckets(self, max_batch_size, sched, expected):
        self.assertEqual(schedule.batch_buckets(max_batch_size, sched), expected)

    @parameterized.named_parameters(
        dict(testcase_name="smallest", n=1, expected=1),
        dict(testcase_name="exact", n=8, expected=8),
        dict(testcase_name="between", n=5, expected=8),
        dict(testcase_name="last", n=12, expected=12),
    )
    def test_bucket_for(self, n, expected):
        self.assertEqual(schedule.bucket_for(n, (1, 2, 4, 8, 12)), expected)

    def test_bucket_for_errors_name_n_and_buckets(self):
        with self.assertRaisesRegex(ValueError, r"n=13.*\(1, 2, 4, 8, 12\)"):
            schedule.bucket_for(13, (1, 2, 4, 8, 12))
        with self.assertRaisesRegex(ValueError, "n must be >= 1, got 0"):
            schedule.bucket_for(0, (1, 2))

    def test_batch_buckets_errors(self):
        with self.assertRaisesRegex(ValueError, "max_batch_size.*got 0"):
            schedule.batch_buckets(0)
        with self.assertRaisesRegex(ValueError, "key 0"):
            schedule.batch_buckets(4, {0: 1})

    @hypothesis.settings(max_examples=60, deadline=None)
    @hypothesis.given(schedules(), st.integers(1, 48))
    def test_draft_len_constant_inside_each_bucket(self, schedule_and_max, max_batch_size):
        pairs, max_draft_len = schedule_and_max
        buckets = schedule.batch_buckets(max_batch_size, pairs)
        self.assertEqual(buckets[-1], max_batch_size)
        self.assertLessEqual(len(buckets), max_batch_size.bit_length() + 1 + len(pairs))
        for n in range(1, max_batch_size + 1):
            bucket = schedule.bucket_for(n, buckets)
            self.assertEqual(schedule.draft_len_for_batch_size(pairs, n, max_draft_len),
                             schedule.draft_len_for_batch_size(pairs, bucket, max_draft_len))


class BatchBucketBaseTest(parameterized.TestCase):

    @parameterized.named_parameters(
        dict(testcase_name="custom_base", base=(4,), sched={3: 4, 8: 2},
             expected=(3, 4, 8, 12)),
        dict(testcase_name="base_above_max_dropped", base=(2, 16), sched=None,
             expected=(2, 12)),
        dict(testcase_name="empty_base", base=(), sched=None, expected=(12,)),
    )
    def test_base(self, base, sched, expected):
        self.assertEqual(schedule.batch_buckets(12, sched, base), expected)

    def test_bad_base(self):
        with self.assertRaisesRegex(ValueError, "batch bucket 0"):
            schedule.batch_buckets(12, None, (0, 4))


if __name__ == "__main__":
    absltest.main()
