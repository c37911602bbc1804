"""Pallas Triton kernel: a row-invariant linear layer, `y = [residual +] norm(x) @ w`.

Reference (same contract, and the CPU path): `jaxspec.device.linear.linear_reference`.

Every output row is computed the same way whatever the number of rows in the call: rows run in
tiles of `ROW_TILE` (the wrapper pads them), each program reduces over K in chunks of `block_k`
in order, with no split-K, and the tile sizes depend only on the weight's shape. So a row's
result is bit-identical in a plain step (one row per request), a verify step (1 + K rows) and
any batch, which is what `numerics="exact"` needs; XLA:GPU instead lowers a one-row dot to a
multiply and a reduction and a five-row one to a split-K GEMM, in different orders.

One program per (row tile, column block). With `norm`, the program first sums each row's squares
over K (chunk by chunk, in order) and scales every chunk it loads by `rsqrt(mean + eps) * g`, as
`jaxspec.models.llama.RMSNorm` does, so the norm costs no kernel of its own.
"""

import functools

import jax
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu
import jax.numpy as jnp

# Rows per program: the smallest tile a Triton dot takes. Every call uses it, so a row never
# changes tile shape; a decode step of one row pads 15.
ROW_TILE = 16
# Reduction chunk: the largest of these that divides K.
BLOCK_K_CHOICES = (64, 32, 16)
# Column blocks: the largest that still gives MIN_PROGRAMS column blocks, at least the smallest.
# A decode step reads the weights once; more programs read them in parallel.
BLOCK_N_CHOICES = (64, 32, 16)
MIN_PROGRAMS = 32
NUM_WARPS = 4
NUM_STAGES = 2
DTYPES = (jnp.dtype(jnp.float32), jnp.dtype(jnp.bfloat16))


def block_sizes(k: int, n: int) -> tuple[int, int]:
    """(block_k, block_n) for a weight of K x N.

    Raises:
      NotImplementedError: K or N has no divisor among the choices.
    """
    block_k = next((b for b in BLOCK_K_CHOICES if k % b == 0), None)
    fits = [b for b in BLOCK_N_CHOICES if n % b == 0]
    if block_k is None or not fits:
        raise NotImplementedError(f"K = {k} and N = {n} need divisors among "
                                  f"{BLOCK_K_CHOICES} and {BLOCK_N_CHOICES}")
    block_n = next((b for b in fits if n // b >= MIN_PROGRAMS), fits[-1])
    return block_k, block_n


def _dot(a, b, *, trans_b: bool):
    contract = ((1,), (1,)) if trans_b else ((1,), (0,))
    # float32 in IEEE precision (Triton's default is TF32); bfloat16 on the tensor cores.
    precision = lax.Precision.HIGHEST if a.dtype == jnp.float32 else None
    return lax.dot_general(a, b, (contract, ((), ())), precision=precision,
                           preferred_element_type=jnp.float32)


def _linear_kernel(
    # inputs
    x_ref,            # [M, K], M a multiple of ROW_TILE
    w_ref,            # [K, N], or [N, K] with transpose_w
    g_ref,            # [K] norm weight (read only with norm)
    r_ref,            # [M, N] residual (read only with residual)
    # outputs
    o_ref,            # [M, N]
    *, block_k: int, block_n: int, eps: float, norm: bool, residual: bool,
    transpose_w: bool,
):
    rows = pl.ds(pl.program_id(0) * ROW_TILE, ROW_TILE)
    cols = pl.ds(pl.program_id(1) * block_n, block_n)
    k_dim = x_ref.shape[1]
    steps = k_dim // block_k
    if norm:
        def squares(s, total):
            x = x_ref[rows, pl.ds(s * block_k, block_k)].astype(jnp.float32)
            return total + jnp.sum(x * x, axis=1)

        total = lax.fori_loop(0, steps, squares, jnp.zeros((ROW_TILE,), jnp.float32))
        inv = lax.rsqrt(total / k_dim + eps)

    def body(s, acc):
        chunk = pl.ds(s * block_k, block_k)
        x = x_ref[rows, chunk]
        if norm:
            scale = g_ref[chunk].astype(jnp.float32)
            x = ((x.astype(jnp.float32) * inv[:, None]) * scale[None, :]).astype(w_ref.dtype)
        w = w_ref[cols, chunk] if transpose_w else w_ref[chunk, cols]
        return acc + _dot(x, w, trans_b=transpose_w)

    acc = lax.fori_loop(0, steps, body, jnp.zeros((ROW_TILE, block_n), jnp.float32))
    out = acc.astype(o_ref.dtype)
    if residual:
        out = r_ref[rows, cols] + out
    o_ref[rows, cols] = out


def static_validate(x, w, *, norm_weight=None, residual=None, transpose_w: bool = False,
                    out_dtype=None) -> None:
    """Checks shapes and dtypes before tracing.

    Raises:
      ValueError: inconsistent shapes or dtypes, naming them.
      NotImplementedError: dtypes or sizes this kernel does not take (the switch falls back to
        the reference).
    """
    if x.ndim != 2 or w.ndim != 2:
        raise ValueError(f"x must be [M, K] and w 2-D, got {x.shape} and {w.shape}")
    k, n = (w.shape[1], w.shape[0]) if transpose_w else w.shape
    if x.shape[1] != k:
        raise ValueError(f"x has {x.shape[1]} features, the weight {k} (transpose_w="
                         f"{transpose_w})")
    if norm_weight is not None and norm_weight.shape != (k,):
        raise ValueError(f"norm_weight must be [{k}], got {norm_weight.shape}")
    if residual is not None and residual.shape != (x.shape[0], n):
        raise ValueError(f"residual must be {(x.shape[0], n)}, got {residual.shape}")
    out_dtype = x.dtype if out_dtype is None else out_dtype
    if x.dtype != w.dtype or (residual is not None and residual.dtype != out_dtype):
        raise ValueError(f"x and w must share a dtype and the residual be the output's, got "
                         f"{x.dtype}, {w.dtype}"
                         + ("" if residual is None else f", {residual.dtype} ({out_dtype})"))
    if x.dtype not in DTYPES:
        raise NotImplementedError(f"dtype {x.dtype}: the kernel takes {[str(d) for d in DTYPES]}")
    if x.shape[0] == 0:
        raise NotImplementedError("no rows")
    block_sizes(k, n)


@functools.partial(jax.jit, static_argnames=("eps", "transpose_w", "out_dtype", "interpret"))
def linear(x, w, norm_weight=None, residual=None, *, eps: float = 1e-5,
           transpose_w: bool = False, out_dtype=None, interpret: bool = False):
    """`[residual +] rmsnorm(x) * norm_weight @ w`, each row computed alike in any call.

    Args:
      x: [M, K] rows, float32 or bfloat16.
      w: [K, N] weights (or [N, K] with `transpose_w`: a tied embedding as the LM head), x's
        dtype.
      norm_weight: [K] RMSNorm weight, or None for no norm.
      residual: [M, N] added to the product (after it is rounded to x's dtype), or None.
      eps: the norm's epsilon.
      transpose_w: w is [N, K].
      out_dtype: the result's dtype (None: x's); the residual's, if any.
      interpret: run the kernel in the Pallas interpreter (any backend; slow, for tests).

    Returns:
      [M, N] in `out_dtype`; products accumulate in float32.

    Raises:
      ValueError / NotImplementedError: see `static_validate`.
    """
    out_dtype = jnp.dtype(x.dtype if out_dtype is None else out_dtype)
    static_validate(x, w, norm_weight=norm_weight, residual=residual, transpose_w=transpose_w,
                    out_dtype=out_dtype)
    m, k = x.shape
    n = w.shape[0] if transpose_w else w.shape[1]
    block_k, block_n = block_sizes(k, n)
    padded = pl.cdiv(m, ROW_TILE) * ROW_TILE
    x_p = jnp.pad(x, ((0, padded - m), (0, 0)))
    r_p = (jnp.zeros((1, 1), out_dtype) if residual is None
           else jnp.pad(residual, ((0, padded - m), (0, 0))))
    g = jnp.zeros((1,), jnp.float32) if norm_weight is None else norm_weight
    kernel = functools.partial(_linear_kernel, block_k=block_k, block_n=block_n, eps=eps,
                               norm=norm_weight is not None, residual=residual is not None,
                               transpose_w=transpose_w)
    out = pl.pallas_call(
        kernel,
        grid=(padded // ROW_TILE, n // block_n),
        out_shape=jax.ShapeDtypeStruct((padded, n), out_dtype),
        compiler_params=plgpu.CompilerParams(num_warps=NUM_WARPS, num_stages=NUM_STAGES),
        interpret=interpret,
        name=f"linear_{block_k=}_{block_n=}",
    )(x_p, w, g, r_p)
    return out[:m]
