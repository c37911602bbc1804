"""The cost model and the acceptance predictor on a recorded run (SmolLM2 on a 2-core CPU, adaptive
SA; `tests/data/record_adaptive_trace.py` made it on 2026-12-01 while other benchmarks shared the
cores, load average about 4.5, so step times are as noisy as the online model ever sees): what
they learn from part of the run predicts the rest, and better than their priors alone."""

import collections
import json
import pathlib
import statistics

import numpy as np
import pytest

from jaxspec.host import acceptance
from jaxspec.host import cost_model

TRACE = json.loads((pathlib.Path(__file__).resolve().parents[1] / "data" /
                    "adaptive_trace.json").read_text())


def _by_key(steps):
    keys = collections.defaultdict(list)
    for rows, k, context, seconds in steps:
        keys[rows, k, cost_model.context_bucket(context)].append(seconds)
    return keys


def test_the_trace_has_what_the_tests_need():
    keys = _by_key(TRACE["steps"])
    widths = {k for (_, k, _) in keys}
    assert len(widths) >= 3 and 0 in widths
    assert len(TRACE["rows"]) >= 100
    assert {m for m, _, _ in TRACE["rows"]} & {1, 2} and max(m for m, _, _ in TRACE["rows"]) >= 16


def test_measured_keys_give_their_median_and_held_out_widths_are_estimated():
    keys = _by_key(TRACE["steps"])
    groups = collections.defaultdict(dict)
    for (rows, k, bucket), samples in keys.items():
        if len(samples) >= 3:
            groups[rows, bucket][k] = samples
    checked = 0
    for (rows, bucket), per_k in groups.items():
        model = cost_model.StepCostModel(None)
        for k, samples in per_k.items():
            for s in samples:
                model.observe(rows, k, bucket, s)
        ks = sorted(per_k)
        costs = model.costs(rows, bucket, ks)
        expected = [statistics.median(per_k[k][-cost_model.WINDOW:]) for k in ks]
        np.testing.assert_allclose(costs, expected)
        if len(ks) < 3:
            continue
        # Leave one width out (not the widest: a line is fitted, not extrapolated far): the
        # estimate from the others lands within 40% of what was measured (the samples of one
        # key spread by 2x in this trace).
        for held in ks[1:-1]:
            partial = cost_model.StepCostModel(None)
            for k in ks:
                if k != held:
                    for s in per_k[k]:
                        partial.observe(rows, k, bucket, s)
            (estimate,) = partial.costs(rows, bucket, [held])
            measured = statistics.median(per_k[held][-cost_model.WINDOW:])
            assert abs(estimate - measured) <= 0.4 * measured, (rows, bucket, held)
            checked += 1
    assert checked >= 1


def _error(predictor, rows):
    """Predicted minus observed accepted drafts, summed over `rows`, relative to observed."""
    predicted = sum(predictor.expected_accepted(m, d)[min(d, predictor.max_positions)]
                    for m, d, _ in rows)
    observed = sum(min(a, d) for _, d, a in rows)
    return (predicted - observed) / observed


def test_calibration_on_the_first_half_predicts_the_second():
    rows = [r for r in TRACE["rows"] if r[1] > 0]
    half = len(rows) // 2
    k = max(d for _, d, _ in rows)
    prior = acceptance.AcceptancePredictor(max_positions=k)
    calibrated = acceptance.AcceptancePredictor(max_positions=k)
    for m, d, a in rows[:half]:
        calibrated.observe(m, d, a)
    later = rows[half:]
    assert abs(_error(calibrated, later)) <= 0.2
    assert abs(_error(calibrated, later)) <= abs(_error(prior, later)) + 0.02


def test_longer_matches_are_accepted_more_in_the_run_and_in_the_calibrated_predictor():
    rows = [r for r in TRACE["rows"] if r[1] > 0]
    predictor = acceptance.AcceptancePredictor(max_positions=max(d for _, d, _ in rows))
    for m, d, a in rows:
        predictor.observe(m, d, a)
    short = [min(a, d) / d for m, d, a in rows if m <= 2]
    long = [min(a, d) / d for m, d, a in rows if m >= 8]
    if not short or not long:
        pytest.skip("the trace lacks short or long matches")
    assert statistics.mean(long) > statistics.mean(short)
    assert predictor.probabilities(16)[0] > predictor.probabilities(1)[0]
