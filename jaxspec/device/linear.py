"""The row-invariant linear layer of `numerics="exact"`: `y = [residual +] norm(x) @ w`.

A plain step computes one row per request and a verify step 1 + K; XLA picks a different kernel
for each row count (a one-row dot becomes a multiply and a reduction on the GPU, a GEMV on the
CPU), and the last bits of every logit then depend on how many rows ran together: speculative
greedy output can differ from plain greedy output at a near-tie. Here every row is computed by
the same fixed-shape program whatever the number of rows: `ROW_TILE` rows at a time (padded),
the norm, the product and the residual inside one tile function, tiles one after another
(`lax.map`, not a batched op whose kernel could again depend on the count).

This is the XLA reference of `jaxspec.pallas_kernels.linear` and the CPU path; a model calls
`jaxspec.device.ops.linear`, which picks the implementation.
"""

import functools

import jax
import jax.numpy as jnp

ROW_TILE = 16                 # the kernel's row tile (pallas_kernels/linear.py)


def rms_scale(x: jax.Array, weight: jax.Array, eps: float) -> jax.Array:
    """RMSNorm over the last axis of `x` [..., K], in float32 whatever x's dtype, scaled by
    `weight` [K]; returned in x's dtype. The one formula of the models' norms and of this layer's
    (the kernel computes the same, in the same order)."""
    scale = weight.astype(jnp.float32).reshape((1,) * (x.ndim - 1) + (-1,))
    x32 = x.astype(jnp.float32)
    normed = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + eps)
    return (normed * scale).astype(x.dtype)


def _tile(x, residual, w, norm_weight, *, eps: float, transpose_w: bool, out_dtype):
    if norm_weight is not None:
        x = rms_scale(x, norm_weight, eps)
    y = jnp.dot(x, w.T if transpose_w else w, preferred_element_type=jnp.float32)
    y = y.astype(out_dtype)
    return y if residual is None else residual + y


@functools.partial(jax.jit, static_argnames=("eps", "transpose_w", "out_dtype"))
def linear_reference(x, w, norm_weight=None, residual=None, *, eps: float = 1e-5,
                     transpose_w: bool = False, out_dtype=None):
    """`[residual +] rmsnorm(x) * norm_weight @ w` in tiles of ROW_TILE rows.

    Args:
      x: [M, K] rows.
      w: [K, N] weights, or [N, K] with `transpose_w`.
      norm_weight: [K] RMSNorm weight, or None for no norm.
      residual: [M, N] added to the product rounded to x's dtype, or None.
      eps: the norm's epsilon.
      transpose_w: w is [N, K] (a tied embedding as the LM head).
      out_dtype: the result's dtype (None: x's); the residual's, if any.

    Returns:
      [M, N] in `out_dtype`; products accumulate in float32.
    """
    m = x.shape[0]
    tiles = -(-m // ROW_TILE)
    pad = ((0, tiles * ROW_TILE - m), (0, 0))
    xs = jnp.pad(x, pad).reshape(tiles, ROW_TILE, -1)
    rs = None if residual is None else jnp.pad(residual, pad).reshape(tiles, ROW_TILE, -1)
    tile = functools.partial(_tile, w=w, norm_weight=norm_weight, eps=eps,
                             transpose_w=transpose_w,
                             out_dtype=x.dtype if out_dtype is None else out_dtype)
    out = jax.lax.map(lambda args: tile(*args), (xs, rs))
    return out.reshape(tiles * ROW_TILE, -1)[:m]
