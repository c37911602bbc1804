"""The attention tuning benchmark at CPU sizes (interpreted kernels): each variant runs and the
kernels' launch constants are restored after it."""

import jax.numpy as jnp
import pytest

from benchmarks import attention_tuning
from jaxspec.pallas_kernels import paged_attention


@pytest.mark.parametrize("kernel", ["cached", "causal"])
def test_a_variant_runs_and_restores_the_constants(kernel):
    before = dict(paged_attention.LAUNCH)
    us = attention_tuning.time_variant(kernel, jnp.dtype(jnp.bfloat16), 8, 1, batch=1,
                                       context=40, k=1, calls=1, layers=2, interpret=True)
    assert us > 0
    assert paged_attention.LAUNCH == before


def test_refuses_without_a_gpu(capsys):
    assert attention_tuning.main([]) == 2
    assert "needs a GPU" in capsys.readouterr().err
