"""Profiling the step-cost model ahead of time, and `jaxspec profile`."""

import jax.numpy as jnp

from jaxspec import cli
from jaxspec import models
from jaxspec.host import cost_model
from jaxspec.host import profile


def test_profile_measures_every_key(tiny_lm, tmp_path):
    costs = cost_model.StepCostModel(tmp_path / "m.json")
    profile.profile(tiny_lm, costs, batch_sizes=[1, 2], widths=[0, 2], contexts=[10, 300],
                    repeats=2, progress=False)
    keys = [(r, k, c) for r, k, c, _, _ in costs.table()]
    assert keys == [(r, k, c) for r in (1, 2) for k in (0, 2) for c in (128, 512)]
    assert all(n == 2 and t > 0 for *_, t, n in costs.table())
    assert cost_model.StepCostModel(tmp_path / "m.json").table() == costs.table()   # saved
    table = profile.format_table(costs)
    assert len(table.splitlines()) == 2 + 8 and "1.00x" in table


def test_cli_profile_and_show(tiny_lm, monkeypatch, capsys):
    monkeypatch.setattr(models, "load", lambda path: (tiny_lm, None))
    assert cli.main(["profile", "--batch-sizes", "1", "--widths", "0,1", "--contexts", "64",
                     "--repeats", "1", "--compile-cache", ""]) == 0
    out = capsys.readouterr().out
    assert "| 1 | 1 | 128 |" in out and "Step-cost model" in out
    assert cli.main(["profile", "--show", "--compile-cache", ""]) == 0
    assert "| 1 | 0 | 128 |" in capsys.readouterr().out
    assert cli.main(["profile", "--widths", "a,b", "--compile-cache", ""]) == 2
    assert "--widths takes comma-separated integers" in capsys.readouterr().err


def test_profile_keeps_the_kv_pages_in_the_models_dtype(tiny_lm, monkeypatch):
    from jaxspec.device import kv_cache
    from jaxspec.models import precision

    made = []
    init_pages = kv_cache.init_pages
    monkeypatch.setattr(kv_cache, "init_pages",
                        lambda **kw: made.append(kw["dtype"]) or init_pages(**kw))
    costs = cost_model.StepCostModel()
    profile.profile(precision.cast(tiny_lm, "bfloat16"), costs, batch_sizes=[1], widths=[1],
                    contexts=[20], repeats=1, progress=False, implementation="xla")
    assert made == [jnp.bfloat16] and len(costs.table()) == 1
