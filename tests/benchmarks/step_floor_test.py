"""The step-floor benchmark runs end to end on the tiny model (no timing checks)."""

from benchmarks import step_floor


def test_measures_and_reports_on_the_tiny_model(tiny_lm):
    proj = step_floor.measure_projections(tiny_lm, rows=(1, 3), repeats=1)
    att = step_floor.measure_attention(tiny_lm.cache_spec, contexts=(40,), k=2, repeats=1)
    steps = step_floor.measure_steps(tiny_lm, contexts=(40,), k=2, repeats=1)
    kernels = step_floor.layer_kernels(tiny_lm)
    assert len(kernels) == tiny_lm.cfg.num_layers and all(len(k) == 4 for k in kernels)
    assert proj["bytes"] == 4 * sum(w.size for layer in kernels for w in layer)
    assert set(proj["seconds"]) == {1, 3} and proj["read_s"] > 0
    [row] = att["rows"]
    spec = tiny_lm.cache_spec
    assert row["bytes"] == 2 * spec.num_layers * 40 * spec.num_kv_heads * spec.head_dim * 4
    assert set(row["seconds"]) == {1, 3}
    assert set(steps[40]) == {0, 2} and all(s > 0 for s in steps[40].values())
    text = step_floor.markdown(dict(model="tiny", k=2, projections=proj, attention=att,
                                    steps=steps), 1)
    assert "| 3 |" in text and "| 40 |" in text and "step ms K=2" in text


def test_markdown_ratios():
    results = dict(model="m", k=5,
                   projections=dict(bytes=2e9, seconds={1: 0.02, 6: 0.03}, read_s=0.01),
                   attention=dict(num_layers=30, rows=[dict(context=4096, bytes=1e9,
                                                            seconds={1: 0.02, 6: 0.045},
                                                            read_s=0.005)]),
                   steps={4096: {0: 0.05, 5: 0.09}})
    text = step_floor.markdown(results, 5)
    assert "| 1 | 20.00 | 100.0 | 1.00x |" in text
    assert "| 6 | 30.00 | 66.7 | 1.50x |" in text
    assert "Reading every weight once: 10.00 ms (200.0 GB/s)." in text
    row = "| 4,096 | 50.0 | 90.0 | 1.80x | 40.0 | 10.0 | 25.0 | 20.00 | 50.0 | 5.00 | 4.0x |"
    assert row in text
