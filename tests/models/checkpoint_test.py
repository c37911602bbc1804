"""Building a model from host arrays: exact round trip and shape/name checks."""

import numpy as np
import pytest

from jaxspec.models import checkpoint
from jaxspec.models import tiny


@pytest.mark.parametrize("tie", [True, False])
def test_build_model_round_trips_flat_params(tie):
    original = checkpoint.flat_params(tiny.tiny_model(2, tie_embeddings=tie))
    cfg = tiny.tiny_config(tie_embeddings=tie)
    assert {k: v.shape for k, v in original.items()} == checkpoint.param_shapes(cfg)
    rebuilt = checkpoint.flat_params(checkpoint.build_model(cfg, original))
    assert rebuilt.keys() == original.keys()
    for name, value in original.items():
        np.testing.assert_array_equal(rebuilt[name], value)


def test_mismatched_checkpoints_are_value_errors():
    cfg = tiny.tiny_config()
    params = checkpoint.flat_params(tiny.tiny_model(0))
    with pytest.raises(ValueError, match=r"missing \['norm.weight'\]"):
        checkpoint.build_model(cfg, {k: v for k, v in params.items() if k != "norm.weight"})
    with pytest.raises(ValueError, match=r"unexpected \['lm_head.kernel'\]"):
        checkpoint.build_model(cfg, dict(params, **{"lm_head.kernel": np.zeros((64, 128))}))
    with pytest.raises(ValueError, match=r"layers.k_proj.kernel has shape \(2, 64, 64\)"):
        checkpoint.build_model(cfg, dict(params, **{"layers.k_proj.kernel": np.zeros((2, 64, 64))}))
