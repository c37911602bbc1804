"""The acceptance predictor: buckets, the expected-accepted curve, online calibration."""

import numpy as np
import pytest

from jaxspec.host import acceptance


@pytest.mark.parametrize("match_len, bucket", [
    (0, 0), (1, 0), (2, 1), (3, 2), (4, 3), (5, 3), (6, 4), (8, 5), (11, 5), (12, 6), (16, 7),
    (31, 8), (32, 9), (1000, 9)])
def test_match_buckets(match_len, bucket):
    assert acceptance.match_bucket(match_len) == bucket


def test_expected_accepted_is_the_sum_of_reach_probabilities():
    predictor = acceptance.AcceptancePredictor(max_positions=4)
    p = predictor.probabilities(2)
    assert np.allclose(p, acceptance.PRIOR_MEAN[1])
    curve = predictor.expected_accepted(2, draft_len=3)
    want = [0, p[0], p[0] + p[0] * p[1], p[0] + p[0] * p[1] + p[0] * p[1] * p[2]]
    np.testing.assert_allclose(curve[:4], want)
    assert curve[4] == curve[3]                       # nothing past the real draft
    assert curve.shape == (5,)


def test_longer_matches_are_predicted_to_be_accepted_more():
    predictor = acceptance.AcceptancePredictor(max_positions=8)
    curves = [predictor.expected_accepted(m, 8)[-1] for m in (1, 2, 4, 8, 16, 64)]
    assert curves == sorted(curves)


def test_calibration_follows_what_is_observed():
    predictor = acceptance.AcceptancePredictor(max_positions=4)
    # Matches of 3 are always fully accepted here: p -> 1 at every position.
    for _ in range(400):
        predictor.observe(3, draft_len=4, accepted=4)
    assert np.all(predictor.probabilities(3) > 0.98)
    # Matches of 1 never: p[0] -> 0; later positions are never reached and inherit it.
    for _ in range(400):
        predictor.observe(1, draft_len=4, accepted=0)
    p = predictor.probabilities(1)
    assert p[0] < 0.01 and np.all(p[1:] <= p[0] + 1e-12)


def test_positions_never_reached_inherit_what_the_shorter_ones_learned():
    # Drafts of 2 behind 6-token matches, always accepted: positions 0 and 1 learn p -> 1, and
    # the widths never tried look as good (not the bucket's prior of 0.62), so K can grow.
    predictor = acceptance.AcceptancePredictor(max_positions=8)
    for _ in range(200):
        predictor.observe(6, draft_len=2, accepted=2)
    p = predictor.probabilities(6)
    assert np.all(p > 0.97)
    assert predictor.expected_accepted(6, draft_len=8)[8] > 7.5
    untouched = predictor.probabilities(7)           # the same bucket; other buckets keep priors
    np.testing.assert_array_equal(untouched, p)
    assert np.allclose(predictor.probabilities(3), acceptance.PRIOR_MEAN[2])


def test_unobserved_shorter_matches_are_predicted_no_better_than_a_failing_longer_one():
    # Drafts behind 16-token matches rejected at once: the buckets below, never verified, fall
    # to what 16 learned instead of their priors (0.55-0.75); the buckets above keep theirs.
    predictor = acceptance.AcceptancePredictor(max_positions=4)
    for _ in range(40):
        predictor.observe(16, draft_len=4, accepted=0)
    learned = predictor.probabilities(16)[0]
    assert learned < 0.1
    for match in (4, 6, 8, 12):
        assert predictor.probabilities(match)[0] == pytest.approx(learned)
    assert predictor.probabilities(24)[0] == pytest.approx(acceptance.PRIOR_MEAN[8])


def test_observe_counts_reached_positions_only():
    predictor = acceptance.AcceptancePredictor(max_positions=6)
    before_r, before_a = predictor.reached.copy(), predictor.accepted.copy()
    predictor.observe(5, draft_len=4, accepted=2)      # positions 0, 1 accepted, 2 rejected
    m = acceptance.match_bucket(5)
    np.testing.assert_array_equal(predictor.reached[m] - before_r[m], [1, 1, 1, 0, 0, 0])
    np.testing.assert_array_equal(predictor.accepted[m] - before_a[m], [1, 1, 0, 0, 0, 0])
    predictor.observe(5, draft_len=3, accepted=3)      # all accepted: no rejection to count
    np.testing.assert_array_equal(predictor.reached[m] - before_r[m], [2, 2, 2, 0, 0, 0])
    predictor.observe(0, draft_len=3, accepted=0)      # no match: nothing to learn
    predictor.observe(4, draft_len=0, accepted=0)
    np.testing.assert_array_equal(predictor.reached[m] - before_r[m], [2, 2, 2, 0, 0, 0])


def test_exploring_raises_position_zero_by_one_standard_deviation_that_shrinks():
    from jaxspec.host import adaptive

    predictor = acceptance.AcceptancePredictor(max_positions=16)
    prior = acceptance.PRIOR_MEAN[2]
    raised = prior + np.sqrt(prior * (1 - prior) / acceptance.PRIOR_WEIGHT)
    np.testing.assert_allclose(predictor.probabilities(3, explore=True), raised)
    # A 3-token match's prior does not pay for a step three times a plain one; raised, it is
    # tried (the n-gram drafts of code editing, whose real acceptance is 0.55).
    def width(explore):
        curve = predictor.expected_accepted(3, 16, explore=explore)
        return adaptive.choose([0, 16], [1.0, 3.0], [curve], [16]).k
    assert (width(False), width(True)) == (0, 16)
    for _ in range(3):                                # three drafts rejected at position 0
        predictor.observe(3, 16, 0)
    assert width(True) == 0
    mean = predictor.probabilities(3)[0]
    assert mean == pytest.approx(4 * prior / 7)
    assert predictor.probabilities(3, explore=True)[0] == pytest.approx(
        mean + np.sqrt(mean * (1 - mean) / 7))


def test_a_new_predictor_starts_from_what_its_process_learned_capped():
    model, other = object.__new__(_Model), object.__new__(_Model)
    first = acceptance.carried(model, "sa", 4)
    for _ in range(100):
        first.observe(3, draft_len=4, accepted=4)
    second = acceptance.carried(model, "sa", 4)
    # Taught by the first: the same ratios on at most CARRY observations.
    np.testing.assert_allclose(second.reached[2], acceptance.CARRY)
    np.testing.assert_allclose(second.accepted[2], acceptance.CARRY)
    carry, weight = acceptance.CARRY, acceptance.PRIOR_WEIGHT
    assert second.probabilities(3)[0] == pytest.approx(
        (carry + weight * acceptance.PRIOR_MEAN[2]) / (carry + weight))
    # What a request shows of itself soon outweighs the carried past...
    for _ in range(48):
        second.observe(3, draft_len=4, accepted=0)
    assert second.probabilities(3)[0] < 0.3
    # ...and teaches the process too, whose record keeps every observation.
    third = acceptance.carried(model, "sa", 4)
    np.testing.assert_allclose(third.accepted[2, 0] / third.reached[2, 0], 100 / 148)
    # Other models, drafting methods and widths start from the priors.
    for fresh in (acceptance.carried(other, "sa", 4), acceptance.carried(model, "ngram", 4),
                  acceptance.carried(model, "sa", 8)):
        assert not fresh.reached.any()
    acceptance.forget()
    assert not acceptance.carried(model, "sa", 4).reached.any()


class _Model:
    """Weakly referable, hashable by identity, as an `nnx.Module` is."""
