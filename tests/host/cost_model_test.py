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


def test_unmeasured_widths_follow_a_line_through_the_measured_ones():
    model = cost_model.StepCostModel()
    model.observe(1, 0, 500, 0.030)
    model.observe(1, 4, 500, 0.046)
    np.testing.assert_allclose(model.costs(1, 500, [0, 2, 4, 8]), [0.030, 0.038, 0.046, 0.062])


def test_one_measurement_scales_the_prior_and_none_gives_relative_costs():
    model = cost_model.StepCostModel()
    model.observe(2, 0, 100, 0.5)
    slope = cost_model.PRIOR_SLOPE
    np.testing.assert_allclose(model.costs(2, 100, [0, 5]), [0.5, 0.5 * (1 + 5 * slope)])
    np.testing.assert_allclose(model.costs(8, 100, [0, 5]), [1.0, 1 + 5 * slope])


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
