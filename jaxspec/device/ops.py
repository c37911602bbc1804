"""The kernel-backed ops and the implementation switch: the only place that picks a kernel.

`implementation=None` runs the Pallas kernel on GPU and the XLA reference elsewhere, and falls
back to the reference when a kernel raises `NotImplementedError` for its inputs; `"pallas"` or
`"xla"` force one (a forced kernel's `NotImplementedError` propagates). The choice is made at
trace time, so these functions can be called inside a caller's `jax.jit` with `implementation`
static. The references are production code (the CPU path); `jaxspec.pallas_kernels` holds the
kernels.

With a device mesh (`jaxspec.device.sharding`), each op runs under `shard_map`, kernel or
reference alike: attention per (data shard of rows, model shard of KV heads), the automata
replicated (every device runs every row: a few hundred scalar operations each).
"""

import functools
import importlib
from typing import Literal

import jax
from jax.sharding import PartitionSpec as P

from jaxspec.device import attention
from jaxspec.device import causal_attention as causal_lib
from jaxspec.device import kv_cache
from jaxspec.device import linear as linear_lib
from jaxspec.device import sa_global
from jaxspec.device import sa_state
from jaxspec.device import sharding

Implementation = Literal["pallas", "xla"]
IMPLEMENTATIONS: tuple[Implementation, ...] = ("pallas", "xla")


def resolve(implementation: Implementation | None) -> Implementation:
    """The implementation `None` stands for on this backend; ValueError for an unknown name."""
    if implementation is not None and implementation not in IMPLEMENTATIONS:
        raise ValueError(f"implementation must be one of {IMPLEMENTATIONS} or None, got "
                         f"{implementation!r}")
    if implementation is None:
        return "pallas" if jax.default_backend() == "gpu" else "xla"
    return implementation


def _dispatch(implementation, kernel: tuple[str, str], xla_fn, *args, kernel_kwargs=None,
              **kwargs):
    if resolve(implementation) == "pallas":
        # Imported on demand: the Triton backend (and its deprecation warning) loads only here.
        module, name = kernel
        pallas_fn = getattr(importlib.import_module(f"jaxspec.pallas_kernels.{module}"), name)
        try:
            return pallas_fn(*args, **{**kwargs, **(kernel_kwargs or {})})
        except NotImplementedError:
            if implementation == "pallas":
                raise
    return xla_fn(*args, **kwargs)


def _replicated(mesh, fn, *args):
    """`fn(*args)` on every device of `mesh` with every input and output replicated (or plainly
    without a mesh)."""
    if mesh is None:
        return fn(*args)
    return jax.shard_map(fn, mesh=mesh, in_specs=P(), out_specs=P(), check_vma=False)(*args)


def sa_extend_and_lookup(state, slots, accepted, num_accepted, *, draft_len: int,
                         max_ngram_size: int = -1,
                         implementation: Implementation | None = None, mesh=None):
    """Extend + lookup (`jaxspec.device.sa_state.extend_and_lookup`) by the chosen implementation.

    Returns:
      `(state, match_len i32[B], draft_tokens i32[B, draft_len], draft_lens i32[B])`.
    """
    run = functools.partial(_dispatch, implementation, ("sa_extend", "sa_extend_and_lookup"),
                            sa_state.extend_and_lookup, draft_len=draft_len,
                            max_ngram_size=max_ngram_size)
    return _replicated(mesh, run, state, slots, accepted, num_accepted)


def sa_extend_and_global_search(state, slots, accepted, num_accepted, active_mask, *,
                                draft_len: int, max_ngram_size: int = -1,
                                implementation: Implementation | None = None, mesh=None):
    """Extend + global search (`jaxspec.device.sa_global.extend_and_global_search`).

    Returns:
      `(state, match_len i32[B], draft_tokens i32[B, draft_len], draft_lens i32[B])`.
    """
    run = functools.partial(_dispatch, implementation,
                            ("sa_global", "sa_extend_and_global_search"),
                            sa_global.extend_and_global_search, draft_len=draft_len,
                            max_ngram_size=max_ngram_size)
    return _replicated(mesh, run, state, slots, accepted, num_accepted, active_mask)


# The kernel's block: 8 pages of 16 = 128 keys per loop iteration, a tile that fits the SMs'
# registers with up to 64 query rows (the reference picks its own, for the CPU).
KERNEL_PAGES_PER_BLOCK = 8


def attention_partials(q, k_new, v_new, k_pages, v_pages, page_table, lengths, *, layer: int,
                       pages_per_block: int, tree=None,
                       implementation: Implementation | None = None, mesh=None):
    """Attention partials over the cached slots and the new tokens
    (`jaxspec.device.attention.attention_partials`) by the chosen implementation; the kernel
    loads `KERNEL_PAGES_PER_BLOCK` pages per step. With a mesh, each device computes its data
    shard's rows for its model shard's KV heads.

    Returns:
      `(acc f32[B, Hkv, Q, D], m f32[B, Hkv, Q], l f32[B, Hkv, Q])`.
    """
    run = functools.partial(_dispatch, implementation, ("paged_attention", "attention_partials"),
                            attention.attention_partials, layer=layer,
                            pages_per_block=pages_per_block,
                            kernel_kwargs=dict(pages_per_block=KERNEL_PAGES_PER_BLOCK))
    if mesh is None:
        return run(q, k_new, v_new, k_pages, v_pages, page_table, lengths, tree=tree)
    heads, rows = P(sharding.DATA, sharding.MODEL), P(sharding.DATA)
    args = (q, k_new, v_new, k_pages, v_pages, page_table, lengths)
    specs = (heads, heads, heads, sharding.KV_SPEC, sharding.KV_SPEC, rows, rows)
    if tree is None:
        return jax.shard_map(run, mesh=mesh, check_vma=False, in_specs=specs,
                             out_specs=(heads, heads, heads))(*args)
    # The tree travels as one more operand, sharded by rows like the tables.
    return jax.shard_map(lambda *a: run(*a[:-1], tree=a[-1]), mesh=mesh, check_vma=False,
                         in_specs=(*specs, rows), out_specs=(heads, heads, heads))(*args, tree)


def paged_attention(q, k_new, v_new, kv: kv_cache.KVPages, layer: int,
                    view: kv_cache.CacheView):
    """`jaxspec.device.attention.paged_attention` with the partials by `view.implementation`:
    what a model calls."""
    partials = functools.partial(attention_partials, implementation=view.implementation,
                                 mesh=view.mesh)
    return attention.paged_attention(q, k_new, v_new, kv, layer, view, partials=partials)


def linear(x, w, norm_weight=None, residual=None, *, eps: float = 1e-5,
           transpose_w: bool = False, out_dtype=None,
           implementation: Implementation | None = None):
    """The row-invariant `[residual +] rmsnorm(x) * norm_weight @ w`
    (`jaxspec.device.linear.linear_reference`) by the chosen implementation.

    Returns:
      [M, N] in `out_dtype` (None: x's).
    """
    return _dispatch(implementation, ("linear", "linear"), linear_lib.linear_reference, x, w,
                     norm_weight, residual, eps=eps, transpose_w=transpose_w,
                     out_dtype=out_dtype)


def causal_attention(q, k_pages, v_pages, page_table, lengths, *, layer: int, num_new: int,
                     tree=None, implementation: Implementation | None = None):
    """Exact mode's attention partials (`jaxspec.device.causal_attention.causal_attention`) by
    the chosen implementation.

    Returns:
      `(acc f32[B, Hkv, S, Q, D], m f32[B, Hkv, S, Q], l f32[B, Hkv, S, Q])`, S splits.
    """
    return _dispatch(implementation, ("paged_attention", "causal_attention"),
                     causal_lib.causal_attention, q, k_pages, v_pages, page_table, lengths,
                     layer=layer, num_new=num_new, tree=tree)


def exact_attention(q, k_new, v_new, kv: kv_cache.KVPages, layer: int,
                    view: kv_cache.CacheView):
    """`jaxspec.device.causal_attention.exact_attention` with the partials by
    `view.implementation`: what a model calls in exact mode.

    Raises:
      ValueError: a view on a mesh (exact mode runs on one device).
    """
    if view.mesh is not None:
        raise ValueError("numerics='exact' runs on one device: drop the mesh or use 'fast'")
    partials = functools.partial(causal_attention, implementation=view.implementation)
    return causal_lib.exact_attention(q, k_new, v_new, kv, layer, view, partials=partials)
