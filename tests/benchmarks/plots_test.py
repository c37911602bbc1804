"""The plots are written as PNG files and refuse data they cannot draw."""

import pytest

from benchmarks import plots

pytest.importorskip("matplotlib")
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def test_acceptance_histograms(tmp_path):
    path = plots.acceptance_histograms(
        {"SA": {"1": 3, "6": 9}, "NGram": {"1": 5, "2": 4}, "HF": None},
        tmp_path / "sub" / "hist.png", title="t")
    assert path.read_bytes().startswith(PNG_MAGIC)
    with pytest.raises(ValueError, match="no acceptance-length histogram"):
        plots.acceptance_histograms({"HF": None}, tmp_path / "x.png", title="t")


def test_throughput_vs_batch(tmp_path):
    path = plots.throughput_vs_batch([1, 2, 4], {"off": [5.0, 9.0, 15.0], "fixed": [9, 14, 16]},
                                     tmp_path / "tp.png", title="t")
    assert path.read_bytes().startswith(PNG_MAGIC)
    with pytest.raises(ValueError, match="2 values for 3 batch sizes"):
        plots.throughput_vs_batch([1, 2, 4], {"off": [1.0, 2.0]}, tmp_path / "y.png", title="t")


def test_step_time_vs_context(tmp_path):
    path = plots.step_time_vs_context(
        [128, 1024, 8000], {"plain": [40.0, 50.0, 90.0], "SA": [60.0, None, 100.0],
                            "SA per token": [20.0, None, 40.0], "HF": [None, None, None]},
        tmp_path / "steps.png", title="t", dashed=("SA per token",))
    assert path.read_bytes().startswith(PNG_MAGIC)
    with pytest.raises(ValueError, match="1 values for 3 contexts"):
        plots.step_time_vs_context([1, 2, 3], {"plain": [1.0]}, tmp_path / "y.png", title="t")
    with pytest.raises(ValueError, match="no step time"):
        plots.step_time_vs_context([1], {"HF": [None]}, tmp_path / "z.png", title="t")
