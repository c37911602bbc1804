"""The step-cost model: medians per key, estimates for unmeasured widths, persistence."""

import numpy as np
import pytest

from jaxspec.host import cost_model


def timed(model, rows, k, context, seconds):
    """`MIN_SAMPLES` alike samples: a key the model trusts."""
    for _ in range(cost_model.MIN_SAMPLES):
        model.observe(rows, k, context, seconds)


@pytest.mark.parametrize("tokens, bucket", [(0, 128), (128, 128), (129, 256), (4000, 4096),
                                            (8192, 8192)])
def test_context_buckets(tokens, bucket):
    assert cost_model.context_bucket(tokens) == bucket


def test_median_of_the_last_samples():
    model = cost_model.StepCostModel()
    for seconds in (0.1, 0.5, 0.2, 9.0, 0.3):
        model.observe(4, 2, 1000, seconds)
    assert model.measured(4, 2, 1000) == 0.3
    assert model.measured(4, 2, 700) == 0.3                 # same context bucket
    assert model.measured(4, 3, 1000) is None
    for _ in range(cost_model.WINDOW):
        model.observe(4, 2, 1000, 1.0)
    assert model.measured(4, 2, 1000) == 1.0                # old samples leave the window


def test_the_plain_step_is_unsettled_until_timed_enough_and_while_slower_than_a_verify_step():
    model = cost_model.StepCostModel()
    for _ in range(cost_model.MIN_SAMPLES):
        assert model.plain_unsettled(1, 5000)
        model.observe(1, 0, 5000, 0.112)                    # outliers: the step takes 0.06
    assert not model.plain_unsettled(1, 5000)               # nothing to compare them with yet
    model.observe(1, 2, 5000, 0.101)
    assert not model.plain_unsettled(1, 5000)               # one verify sample is not trusted
    timed(model, 1, 2, 5000, 0.101)
    assert model.plain_unsettled(1, 5000)                   # slower than K = 2 cannot be right
    timed(model, 2, 0, 5000, 0.2)
    assert not model.plain_unsettled(2, 5000)               # each (rows, context) on its own
    for _ in range(cost_model.MIN_SAMPLES + 1):
        model.observe(1, 0, 5000, 0.060)
    assert not model.plain_unsettled(1, 5000)               # median 0.060 < 0.101
    np.testing.assert_allclose(model.costs(1, 5000, [0, 2]), [0.060, 0.101])


def test_a_full_window_settles_a_plain_step_as_slow_as_a_verify_step():
    model = cost_model.StepCostModel()
    timed(model, 1, 1, 100, 0.0300)
    for _ in range(cost_model.WINDOW):
        assert model.plain_unsettled(1, 100)
        model.observe(1, 0, 100, 0.0301)
    assert not model.plain_unsettled(1, 100)


def test_a_width_timed_too_few_times_costs_at_most_its_estimate():
    # Code editing at 1k tokens: one 181 ms sample of K = 12 where K = 8 takes 71 priced every
    # wider draft out for good; a cheap figure is kept (choosing the width corrects it).
    model = cost_model.StepCostModel()
    timed(model, 1, 0, 1000, 0.036)
    timed(model, 1, 6, 1000, 0.076)
    model.observe(1, 12, 1000, 0.181)
    estimate = 0.076 + 6 * cost_model.PRIOR_SLOPE * 0.036
    np.testing.assert_allclose(model.costs(1, 1000, [6, 8, 12]),
                               [0.076, 0.076 + 2 * cost_model.PRIOR_SLOPE * 0.036, estimate])
    model.observe(1, 3, 1000, 0.050)                        # cheaper than the chord (0.056)
    np.testing.assert_allclose(model.costs(1, 1000, [3]), [0.050])
    model.observe(1, 12, 1000, 0.095)
    model.observe(1, 12, 1000, 0.090)                       # trusted: the median of three
    np.testing.assert_allclose(model.costs(1, 1000, [8, 12]),
                               [0.076 + (0.095 - 0.076) / 3, 0.095])


def test_unmeasured_widths_lie_on_lines_between_measured_ones_and_the_prior_slope_beyond():
    model = cost_model.StepCostModel()
    timed(model, 1, 0, 500, 0.030)
    timed(model, 1, 3, 500, 0.042)
    timed(model, 1, 6, 500, 0.048)
    step = cost_model.PRIOR_SLOPE * 0.030
    np.testing.assert_allclose(model.costs(1, 500, [0, 1, 2, 3, 4, 6, 8]),
                               [0.030, 0.034, 0.038, 0.042, 0.044, 0.048, 0.048 + 2 * step])


def test_narrower_widths_than_measured_lie_on_the_chord_from_the_plain_step():
    # Batch 32's shape: K = 2 at 1.64x a plain step, K = 1 measured later at 1.34x. The prior
    # slope down from K = 2 guessed 1.51x; the chord (1.32x) is below the cost, so K = 1 gets tried.
    model = cost_model.StepCostModel()
    timed(model, 32, 0, 100, 1.00)
    timed(model, 32, 2, 100, 1.64)
    np.testing.assert_allclose(model.costs(32, 100, [0, 1, 2]), [1.00, 1.32, 1.64])
    timed(model, 32, 1, 100, 1.34)
    np.testing.assert_allclose(model.costs(32, 100, [1]), [1.34])


def test_the_plain_step_stays_out_of_the_line():
    # A CPU's shape: the first verify position costs much more than the next ones. A line through
    # K = 0 and 1 would price K = 16 at 11x; the prior slope from K = 1 prices it near its cost.
    model = cost_model.StepCostModel()
    timed(model, 1, 0, 100, 0.043)
    timed(model, 1, 1, 100, 0.072)
    slope = cost_model.PRIOR_SLOPE * 0.043
    np.testing.assert_allclose(model.costs(1, 100, [0, 1, 4, 16]),
                               [0.043, 0.072, 0.072 + 3 * slope, 0.072 + 15 * slope])
    timed(model, 1, 16, 100, 0.175)
    np.testing.assert_allclose(model.costs(1, 100, [8]), [0.072 + 7 * (0.175 - 0.072) / 15])


def test_one_measurement_scales_the_prior_and_none_gives_relative_costs():
    model = cost_model.StepCostModel()
    timed(model, 2, 0, 100, 0.5)
    slope = cost_model.PRIOR_SLOPE
    np.testing.assert_allclose(model.costs(2, 100, [0, 5]), [0.5, 0.5 * (1 + 5 * slope)])
    np.testing.assert_allclose(model.costs(8, 100, [0, 5]), [1.0, 1 + 5 * slope])
    timed(model, 4, 3, 100, 0.2)                            # a verify width alone: plain from it
    plain = 0.2 / (1 + 3 * slope)
    np.testing.assert_allclose(model.costs(4, 100, [0, 3, 5]),
                               [plain, 0.2, 0.2 + 2 * slope * plain])


def test_a_line_never_slopes_down():
    model = cost_model.StepCostModel()
    timed(model, 1, 0, 100, 0.05)
    timed(model, 1, 2, 100, 0.04)                           # noise: cheaper with more positions
    costs = model.costs(1, 100, [0, 1, 2, 8])
    assert np.all(np.diff(costs[[0, 1, 3]]) >= -1e-12)


def test_saved_and_loaded(tmp_path):
    path = tmp_path / "cost" / "m.json"
    model = cost_model.StepCostModel(path)
    model.observe(4, 3, 2000, 0.25)
    model.save()
    again = cost_model.StepCostModel(path)
    assert again.measured(4, 3, 2000) == 0.25
    assert again.table() == [(4, 3, 2048, 0.25, 1)]


def test_saves_every_so_many_samples(tmp_path):
    path = tmp_path / "m.json"
    model = cost_model.StepCostModel(path)
    for _ in range(cost_model.SAVE_EVERY - 1):
        model.observe(1, 0, 10, 0.1)
    assert not path.exists()
    model.observe(1, 0, 10, 0.1)
    assert path.exists()


def test_default_path_names_model_and_machine(monkeypatch, tmp_path):
    monkeypatch.delenv("JAXSPEC_COST_CACHE", raising=False)
    monkeypatch.setenv("JAXSPEC_CACHE", str(tmp_path))
    path = cost_model.default_path("llama 30x576/bf16")
    assert path.parent == tmp_path / "cost" and path.suffix == ".json"
    assert "llama_30x576_bf16" in path.name and "cpu" in path.name
    monkeypatch.setenv("JAXSPEC_COST_CACHE", str(tmp_path / "elsewhere"))
    assert cost_model.default_path("m").parent == tmp_path / "elsewhere"
