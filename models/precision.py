"""Model precision: which dtype the weights and KV cache use.

float32 is the reference (and the CPU default: CPUs have no fast bfloat16 path for small matmuls).
bfloat16 halves the bytes every step reads and uses the tensor cores, so it is the default on
accelerators. Whatever the weights' dtype, the fast path's activations (residual stream, norms,
RoPE, attention), logits, softmax, sampling and the verify comparison stay float32: a matmul reads
its input in the weights' dtype and accumulates and returns float32. `Float32Param`s (the norms'
scales, as GGUF stores them) stay float32 too: a few KB, and no conversion in any step.
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


class Float32Param(nnx.Param):
    """A parameter that stays float32 whatever the model's dtype (`param_dtype`)."""


def param_dtype(var: nnx.Variable, dtype) -> jnp.dtype:
    """The dtype a model in `dtype` holds `var` in: its own if not floating, float32 for a
    `Float32Param`, else `dtype`."""
    if not jnp.issubdtype(var.dtype, jnp.floating):
        return jnp.dtype(var.dtype)
    return jnp.dtype(jnp.float32 if isinstance(var, Float32Param) else dtype)


def cast(model: nnx.Module, dtype) -> nnx.Module:
    """A copy of `model` with every floating parameter in `dtype` (`param_dtype`: the model
    itself unchanged); `model` itself when nothing needs casting."""
    dtype = resolve(dtype)
    graphdef, state = nnx.split(model)
    flat = nnx.to_flat_state(state)
    if all(var.dtype == param_dtype(var, dtype) for _, var in flat):
        return model
    return nnx.merge(graphdef, nnx.from_flat_state(
        [(path, var.replace(var.get_value().astype(param_dtype(var, dtype))))
         for path, var in flat]))
