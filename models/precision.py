"""Model precision: which dtype the weights, activations and KV cache use.

float32 is the reference (and the CPU default: CPUs have no fast bfloat16 path for small matmuls).
bfloat16 halves the bytes every step reads and uses the tensor cores, so it is the default on
accelerators. Whatever the weights' dtype, logits, softmax, sampling and the verify comparison
stay float32 (the models compute their logits in float32).
"""

from flax import nnx
import jax
import jax.numpy as jnp

DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16}


def resolve(dtype) -> jnp.dtype:
    """A dtype from a name in `DTYPES` or a dtype; None is bfloat16 on an accelerator, float32
    on CPU.

    Raises:
      ValueError: anything else.
    """
    if dtype is None:
        return jnp.dtype(jnp.float32 if jax.default_backend() == "cpu" else jnp.bfloat16)
    if isinstance(dtype, str):
        if dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {sorted(DTYPES)}, got {dtype!r}")
        return jnp.dtype(DTYPES[dtype])
    try:
        resolved = jnp.dtype(dtype)
    except TypeError:
        raise ValueError(f"dtype must be one of {sorted(DTYPES)}, got {dtype!r}") from None
    if resolved not in {jnp.dtype(d) for d in DTYPES.values()}:
        raise ValueError(f"dtype must be one of {sorted(DTYPES)}, got {dtype!r}")
    return resolved


def cast(model: nnx.Module, dtype) -> nnx.Module:
    """A copy of `model` with every floating parameter in `dtype` (the model itself unchanged);
    `model` itself when nothing needs casting."""
    dtype = resolve(dtype)
    graphdef, state = nnx.split(model)
    leaves = jax.tree.leaves(state)
    if all(not jnp.issubdtype(x.dtype, jnp.floating) or x.dtype == dtype for x in leaves):
        return model
    state = jax.tree.map(lambda x: x.astype(dtype) if jnp.issubdtype(x.dtype, jnp.floating)
                         else x, state)
    return nnx.merge(graphdef, state)
