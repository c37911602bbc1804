"""The paged-attention kernels' launch parameters on a GPU: warps and pipeline stages, per page
dtype, at SmolLM2's shapes.

    python -m benchmarks.attention_tuning [--context 2048] [--batch 1] [--json PATH]

The first GPU run found the decode kernel 5x slower on bfloat16 pages than on float32 ones (54
against 10.5 us a layer at 2k tokens), with the same loads and arithmetic but the element size:
something in how Triton pipelines or lays out the narrower gathers. This times each kernel
(`cached_attention`, the fast path's; `causal_attention`, the exact path's) for every (page
dtype, num_warps, num_stages), 30 layers per jitted call as in a step, calls dispatched back to
back: microseconds per layer, launch gaps included. The kernels read their launch parameters
from `paged_attention.LAUNCH` at trace time, so each variant sets them and clears jit's caches.
"""

import argparse
import itertools
import json
import statistics
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

LAYERS, KV_HEADS, GROUPS, HEAD_DIM, PAGE_SIZE = 30, 3, 3, 64, 16
# (page dtype, num_warps, num_stages): today's (4, 2) for both dtypes, then bfloat16 without
# pipelining and wider.
VARIANTS = (("float32", 4, 2), ("bfloat16", 4, 2), ("bfloat16", 4, 1), ("bfloat16", 8, 1))


def _inputs(batch: int, context: int, k: int, dtype):
    rng = np.random.default_rng(0)
    cols = -(-(context + 1 + k) // PAGE_SIZE)
    pages = (LAYERS, batch * cols + 1, PAGE_SIZE, KV_HEADS, HEAD_DIM)
    kp = jnp.asarray(rng.standard_normal(pages), dtype)
    vp = jnp.asarray(rng.standard_normal(pages), dtype)
    table = jnp.asarray(1 + np.arange(batch * cols).reshape(batch, cols), jnp.int32)
    q = jnp.asarray(rng.standard_normal((batch, KV_HEADS, GROUPS * (1 + k), HEAD_DIM)) * 0.1,
                    jnp.float32)
    return q, kp, vp, table, jnp.full((batch,), context, jnp.int32)


def time_variant(kernel: str, dtype, warps: int, stages: int, *, batch: int, context: int,
                 k: int, calls: int = 20, layers: int = LAYERS, interpret: bool = False
                 ) -> float:
    """Microseconds per layer of `kernel` with these launch parameters."""
    from jaxspec.pallas_kernels import paged_attention as pa

    saved = dict(pa.LAUNCH)
    pa.LAUNCH[jnp.dtype(dtype).name] = (warps, stages)
    jax.clear_caches()
    try:
        args = _inputs(batch, context, k, dtype)

        @jax.jit
        def step(q, kp, vp, table, lengths):
            out = []
            for layer in range(layers):
                if kernel == "cached":
                    out.append(pa.cached_attention(q, kp, vp, table, lengths, layer=layer,
                                                   pages_per_block=8, interpret=interpret)[0])
                else:
                    out.append(pa.causal_attention(q, kp, vp, table, lengths, layer=layer,
                                                   num_new=1 + k, interpret=interpret)[0])
            return out

        jax.block_until_ready(step(*args))
        times = []
        for _ in range(3):
            start = time.perf_counter()
            for _ in range(calls):
                result = step(*args)
            jax.block_until_ready(result)
            times.append((time.perf_counter() - start) / calls / layers)
    finally:
        pa.LAUNCH.clear()
        pa.LAUNCH.update(saved)
        jax.clear_caches()
    return 1e6 * statistics.median(times)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--context", type=int, default=2048)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--k", type=int, default=0)
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    if jax.default_backend() != "gpu":
        print("attention tuning needs a GPU", file=sys.stderr)
        return 2
    rows = []
    for kernel, (dtype, warps, stages) in itertools.product(("cached", "causal"), VARIANTS):
        try:
            us = time_variant(kernel, jnp.dtype(dtype), warps, stages, batch=args.batch,
                              context=args.context, k=args.k)
        except Exception as e:  # noqa: BLE001 - a variant Triton rejects is a result too
            us, error = None, f"{type(e).__name__}: {str(e)[:200]}"
        else:
            error = None
        rows.append(dict(kernel=kernel, dtype=dtype, warps=warps, stages=stages, us=us,
                         error=error))
        print(f"{kernel:7s} {dtype:9s} warps {warps} stages {stages}: "
              + (f"{us:7.1f} us/layer" if us is not None else error), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(batch=args.batch, context=args.context, k=args.k, rows=rows), f,
                      indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
