"""Model precision names and defaults."""

import jax
import jax.numpy as jnp
import pytest

from jaxspec.models import precision


def test_names_and_dtypes():
    assert precision.resolve("bfloat16") == jnp.bfloat16
    assert precision.resolve(jnp.float32) == jnp.float32
    assert precision.resolve("float32") == jnp.float32


def test_default_follows_the_backend():
    want = jnp.float32 if jax.default_backend() == "cpu" else jnp.bfloat16
    assert precision.resolve(None) == want


@pytest.mark.parametrize("bad", ["float16", "fp32", jnp.int32, 3])
def test_unknown_dtypes_are_value_errors(bad):
    with pytest.raises(ValueError, match="dtype must be one of"):
        precision.resolve(bad)
