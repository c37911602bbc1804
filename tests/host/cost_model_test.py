"""The step-cost model: medians per key, estimates for unmeasured widths, persistence."""

import numpy as np
import pytest

from jaxspec.host import cost_model


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


def test_unmeasured_widths_lie_on_lines_between_measured_ones_and_the_prior_slope_beyond():
    model = cost_model.StepCostModel()
    model.observe(1, 0, 500, 0.030)
    model.observe(1, 3, 500, 0.042)
    model.observe(1, 6, 500, 0.048)
    step = cost_model.PRIOR_SLOPE * 0.030
    np.testing.assert_allclose(model.costs(1, 500, [0, 1, 2, 3, 4, 6, 8]),
                               [0.030, 0.034, 0.038, 0.042, 0.044, 0.048, 0.048 + 2 * step])


def test_narrower_widths_than_measured_lie_on_the_chord_from_the_plain_step():
    # Batch 32's shape: K = 2 at 1.64x a plain step, K = 1 measured later at 1.34x. The prior
    # slope down from K = 2 guessed 1.51x; the chord (1.32x) is below the cost, so K = 1 gets tried.
    model = cost_model.StepCostModel()
    model.observe(32, 0, 100, 1.00)
    model.observe(32, 2, 100, 1.64)
    np.testing.assert_allclose(model.costs(32, 100, [0, 1, 2]), [1.00, 1.32, 1.64])
    model.observe(32, 1, 100, 1.34)
    np.testing.assert_allclose(model.costs(32, 100, [1]), [1.34])


def test_the_plain_step_stays_out_of_the_line():
    # A CPU's shape: the first verify position costs much more than the next ones. A line through
    # K = 0 and 1 would price K = 16 at 11x; the prior slope from K = 1 prices it near its cost.
    model = cost_model.StepCostModel()
    model.observe(1, 0, 100, 0.043)
    model.observe(1, 1, 100, 0.072)
    slope = cost_model.PRIOR_SLOPE * 0.043
    np.testing.assert_allclose(model.costs(1, 100, [0, 1, 4, 16]),
                               [0.043, 0.072, 0.072 + 3 * slope, 0.072 + 15 * slope])
    model.observe(1, 16, 100, 0.175)
    np.testing.assert_allclose(model.costs(1, 100, [8]), [0.072 + 7 * (0.175 - 0.072) / 15])


def test_one_measurement_scales_the_prior_and_none_gives_relative_costs():
    model = cost_model.StepCostModel()
    model.observe(2, 0, 100, 0.5)
    slope = cost_model.PRIOR_SLOPE
    np.testing.assert_allclose(model.costs(2, 100, [0, 5]), [0.5, 0.5 * (1 + 5 * slope)])
    np.testing.assert_allclose(model.costs(8, 100, [0, 5]), [1.0, 1 + 5 * slope])
    model.observe(4, 3, 100, 0.2)                           # a verify width alone: plain from it
    plain = 0.2 / (1 + 3 * slope)
    np.testing.assert_allclose(model.costs(4, 100, [0, 3, 5]),
                               [plain, 0.2, 0.2 + 2 * slope * plain])


def test_a_line_never_slopes_down():
    model = cost_model.StepCostModel()
    model.observe(1, 0, 100, 0.05)
    model.observe(1, 2, 100, 0.04)                          # noise: cheaper with more positions
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
