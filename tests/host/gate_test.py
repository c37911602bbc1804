"""SpeculationGate and the pooled acceptance rate, on hand-computed sequences."""

from absl.testing import absltest
from absl.testing import parameterized
import hypothesis
from hypothesis import strategies as st
import pytest

from jaxspec.host import gate as gate_lib
from jaxspec.host.gate import SpeculationGate
from jaxspec.host.gate import pooled_acceptance_rate


class SpeculationGateTest(parameterized.TestCase):

    def test_docstring_example(self):
        gate = SpeculationGate(2, 0.5)
        self.assertEqual(gate.record_acceptance_rate(0.2), (False, None))
        self.assertEqual(gate.record_acceptance_rate(0.9), (False, 0.55))
        self.assertEqual(gate.record_acceptance_rate(0.0), (True, 0.45))
        self.assertTrue(gate.disabled)
        self.assertEqual(gate.record_acceptance_rate(1.0), (False, None))
        self.assertTrue(gate.disabled)

    def test_no_decision_before_window_samples(self):
        gate = SpeculationGate(3, 0.9)
        self.assertEqual(gate.record_acceptance_rate(0.0), (False, None))
        self.assertEqual(gate.record_acceptance_rate(0.0), (False, None))
        self.assertFalse(gate.disabled)
        self.assertEqual(gate.record_acceptance_rate(0.0), (True, 0.0))

    def test_average_exactly_at_threshold_does_not_disable(self):
        gate = SpeculationGate(2, 0.5)
        self.assertEqual(gate.record_acceptance_rate(0.25), (False, None))
        self.assertEqual(gate.record_acceptance_rate(0.75), (False, 0.5))
        self.assertFalse(gate.disabled)

    def test_threshold_compared_on_the_exact_window_mean(self):
        # A running sum would hold 0.3 + 0.9 - 0.3 + 0.2 = 1.0999999999999999 and disable here.
        gate = SpeculationGate(2, 0.55)
        gate.record_acceptance_rate(0.3)
        self.assertEqual(gate.record_acceptance_rate(0.9), (False, 0.6))
        self.assertEqual(gate.record_acceptance_rate(0.2), (False, 0.55))
        self.assertFalse(gate.disabled)

    def test_window_rolls(self):
        gate = SpeculationGate(2, 0.5)
        gate.record_acceptance_rate(1.0)
        self.assertEqual(gate.record_acceptance_rate(1.0), (False, 1.0))
        self.assertEqual(gate.record_acceptance_rate(0.5), (False, 0.75))
        self.assertEqual(gate.record_acceptance_rate(0.25), (True, 0.375))

    def test_reset_reenables(self):
        gate = SpeculationGate(1, 0.5)
        self.assertEqual(gate.record_acceptance_rate(0.0), (True, 0.0))
        gate.reset()
        self.assertFalse(gate.disabled)
        self.assertEqual(gate.record_acceptance_rate(0.75), (False, 0.75))
        self.assertEqual(gate.record_acceptance_rate(0.25), (True, 0.25))

    def test_reset_forgets_samples(self):
        gate = SpeculationGate(2, 0.5)
        gate.record_acceptance_rate(0.0)
        gate.reset()
        self.assertEqual(gate.record_acceptance_rate(1.0), (False, None))
        self.assertEqual(gate.record_acceptance_rate(1.0), (False, 1.0))

    def test_none_rate_is_ignored(self):
        gate = SpeculationGate(2, 0.5)
        gate.record_acceptance_rate(0.0)
        self.assertEqual(gate.record_acceptance_rate(None), (False, None))
        self.assertEqual(gate.record_acceptance_rate(0.0), (True, 0.0))

    @parameterized.named_parameters(
        dict(testcase_name="no_window", window=None, threshold=0.5),
        dict(testcase_name="zero_window", window=0, threshold=0.5),
        dict(testcase_name="no_threshold", window=2, threshold=None),
    )
    def test_inactive_gate_never_decides(self, window, threshold):
        gate = SpeculationGate(window, threshold)
        self.assertFalse(gate.active)
        for _ in range(5):
            self.assertEqual(gate.record_acceptance_rate(0.0), (False, None))
        self.assertFalse(gate.disabled)

    @parameterized.parameters(-0.01, 1.01, float("nan"), float("inf"))
    def test_rate_outside_unit_interval_raises(self, rate):
        for gate in (SpeculationGate(2, 0.5), SpeculationGate(None, None)):
            with self.assertRaisesRegex(ValueError, "acceptance rate.*in \\[0, 1\\]"):
                gate.record_acceptance_rate(rate)

    @parameterized.named_parameters(
        dict(testcase_name="negative_window", window=-1, threshold=0.5, match="window.*-1"),
        dict(testcase_name="float_window", window=2.0, threshold=0.5, match="window.*2.0"),
        dict(testcase_name="threshold_above_one", window=2, threshold=1.5, match="threshold.*1.5"),
        dict(testcase_name="threshold_string", window=2, threshold="x", match="threshold.*'x'"),
    )
    def test_invalid_construction(self, window, threshold, match):
        with self.assertRaisesRegex(ValueError, match):
            SpeculationGate(window, threshold)

    @hypothesis.settings(max_examples=100, deadline=None)
    @hypothesis.given(st.integers(1, 5), st.integers(0, 8).map(lambda t: t / 8),
                      st.lists(st.integers(0, 8).map(lambda r: r / 8), max_size=20))
    def test_matches_brute_force(self, window, threshold, rates):
        # Eighths add exactly, so the oracle's plain mean is the exact mean.
        gate = SpeculationGate(window, threshold)
        disabled = False
        for i, rate in enumerate(rates):
            recent = rates[max(0, i + 1 - window):i + 1]
            if disabled or i + 1 < window:
                expected = (False, None)
            else:
                mean = sum(recent) / len(recent)
                disabled = mean < threshold
                expected = (disabled, mean)
            self.assertEqual(gate.record_acceptance_rate(rate), expected)
            self.assertEqual(gate.disabled, disabled)


class PooledAcceptanceRateTest(parameterized.TestCase):

    @parameterized.named_parameters(
        dict(testcase_name="docstring", pairs=[(2, 4), (0, 0), (1, 1)], expected=3 / 5),
        dict(testcase_name="all_accepted", pairs=[(3, 3), (5, 5)], expected=1.0),
        dict(testcase_name="none_accepted", pairs=[(0, 3)], expected=0.0),
        dict(testcase_name="pooled_not_averaged", pairs=[(1, 1), (0, 4)], expected=1 / 5),
        dict(testcase_name="nothing_drafted", pairs=[(0, 0), (0, 0)], expected=None),
        dict(testcase_name="empty_batch", pairs=[], expected=None),
    )
    def test_cases(self, pairs, expected):
        self.assertEqual(pooled_acceptance_rate(pairs), expected)

    @parameterized.named_parameters(
        dict(testcase_name="accepted_above_drafted", pair=(3, 2)),
        dict(testcase_name="negative_accepted", pair=(-1, 2)),
        dict(testcase_name="negative_drafted", pair=(0, -1)),
    )
    def test_invalid_pair(self, pair):
        with self.assertRaisesRegex(ValueError, f"\\({pair[0]}, {pair[1]}\\)"):
            pooled_acceptance_rate([(1, 1), pair])

    def test_feeds_the_gate_over_iterations(self):
        gate = SpeculationGate(2, 0.5)
        batches = [[(3, 4), (0, 0)], [(0, 0)], [(1, 4), (0, 4)]]
        results = [gate.record_acceptance_rate(pooled_acceptance_rate(b)) for b in batches]
        # The middle batch drafted nothing: no sample, so the window is iterations 1 and 3.
        self.assertEqual(results, [(False, None), (False, None), (True, (0.75 + 0.125) / 2)])


if __name__ == "__main__":
    absltest.main()


# ---------------------------------------------------------------------------- reversible gate

def test_reversible_gate_worked_example():
    gate = gate_lib.ReversibleGate(2, 0.5, probe_interval=2)
    gate.record_acceptance_rate(0.0)
    assert gate.record_acceptance_rate(0.2) == (True, 0.1)
    assert gate.disabled
    assert [gate.tick(), gate.tick()] == [False, True]
    assert gate.record_acceptance_rate(0.1) == (False, 0.1)       # failed probe: interval 4
    assert [gate.tick() for _ in range(4)] == [False, False, False, True]
    assert gate.record_acceptance_rate(0.9) == (False, 0.5)       # probes' mean reaches 0.5
    assert not gate.disabled and not gate.tick()


def test_reversible_gate_backs_off_up_to_the_limit():
    gate = gate_lib.ReversibleGate(1, 0.5, probe_interval=1, max_interval=4)
    gate.record_acceptance_rate(0.0)
    assert gate.disabled
    waits = []
    for _ in range(5):
        n = 1
        while not gate.tick():
            n += 1
        waits.append(n)
        gate.record_acceptance_rate(0.0)
    assert waits == [1, 2, 4, 4, 4]


def test_reversible_gate_decides_afresh_after_coming_back():
    gate = gate_lib.ReversibleGate(3, 0.5, probe_interval=1)
    for rate in (0.0, 0.0, 0.0):
        gate.record_acceptance_rate(rate)
    assert gate.disabled and gate.tick()
    gate.record_acceptance_rate(1.0)
    assert not gate.disabled
    # A fresh window: two low samples decide nothing, the third does.
    assert gate.record_acceptance_rate(0.0) == (False, None)
    assert gate.record_acceptance_rate(0.0) == (False, None)
    assert gate.record_acceptance_rate(0.0) == (True, 0.0)


def test_reversible_gate_validates_and_behaves_like_the_permanent_one_until_disabled():
    with pytest.raises(ValueError, match="probe_interval"):
        gate_lib.ReversibleGate(2, 0.5, probe_interval=0)
    gate = gate_lib.ReversibleGate(2, 0.5)
    assert gate.record_acceptance_rate(0.9) == (False, None)
    assert gate.record_acceptance_rate(0.8) == (False, pytest.approx(0.85))
    assert not gate.tick()
    with pytest.raises(ValueError, match="acceptance rate"):
        gate.record_acceptance_rate(1.5)
