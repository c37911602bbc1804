"""Model precision names and defaults, and which parameters a cast leaves in float32."""

from flax import nnx
import jax
import jax.numpy as jnp
import pytest

from jaxspec.models import checkpoint
from jaxspec.models import precision
from jaxspec.models import tiny


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


def _dtypes(model) -> dict[str, jnp.dtype]:
    return {".".join(map(str, path)): var.get_value().dtype
            for path, var in nnx.to_flat_state(nnx.state(model))}


def test_cast_and_build_keep_the_norms_scales_in_float32():
    model = tiny.tiny_model()
    for half in (precision.cast(model, "bfloat16"),
                 checkpoint.build_model(model.cfg, checkpoint.flat_params(model),
                                        dtype=jnp.bfloat16)):
        dtypes = _dtypes(half)
        norms = {name for name in dtypes if name.endswith("norm.weight")}
        assert len(norms) == 2 * model.cfg.num_layers + 1
        assert all(dtypes[name] == jnp.float32 for name in norms)
        assert all(dtype == jnp.bfloat16 for name, dtype in dtypes.items() if name not in norms)
        assert half.dtype == jnp.bfloat16
        # Back to float32, every parameter is float32; an unchanged model is returned as is.
        assert set(_dtypes(precision.cast(half, "float32")).values()) == {jnp.dtype(jnp.float32)}
        assert precision.cast(half, "bfloat16") is half
