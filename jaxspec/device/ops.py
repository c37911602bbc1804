"""The kernel-backed ops and the implementation switch: the only place that picks a kernel.

`implementation=None` runs the Pallas kernel on GPU and the XLA reference elsewhere, and falls
back to the reference when a kernel raises `NotImplementedError` for its inputs; `"pallas"` or
`"xla"` force one (a forced kernel's `NotImplementedError` propagates). The choice is made at
trace time, so these functions can be called inside a caller's `jax.jit` with `implementation`
static. The references are production code (the CPU path); `jaxspec.pallas_kernels` holds the
kernels.
"""

import functools
import importlib
from typing import Literal

import jax

from jaxspec.device import attention
from jaxspec.device import kv_cache
from jaxspec.device import sa_global
from jaxspec.device import sa_state

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


def sa_extend_and_lookup(state, slots, accepted, num_accepted, *, draft_len: int,
                         max_ngram_size: int = -1,
                         implementation: Implementation | None = None):
    """Extend + lookup (`jaxspec.device.sa_state.extend_and_lookup`) by the chosen implementation.

    Returns:
      `(state, match_len i32[B], draft_tokens i32[B, draft_len], draft_lens i32[B])`.
    """
    return _dispatch(implementation, ("sa_extend", "sa_extend_and_lookup"),
                     sa_state.extend_and_lookup, state, slots, accepted, num_accepted,
                     draft_len=draft_len, max_ngram_size=max_ngram_size)


def sa_extend_and_global_search(state, slots, accepted, num_accepted, active_mask, *,
                                draft_len: int, max_ngram_size: int = -1,
                                implementation: Implementation | None = None):
    """Extend + global search (`jaxspec.device.sa_global.extend_and_global_search`).

    Returns:
      `(state, match_len i32[B], draft_tokens i32[B, draft_len], draft_lens i32[B])`.
    """
    return _dispatch(implementation, ("sa_global", "sa_extend_and_global_search"),
                     sa_global.extend_and_global_search, state, slots, accepted, num_accepted,
                     active_mask, draft_len=draft_len, max_ngram_size=max_ngram_size)


# The kernel's block: 8 pages of 16 = 128 keys per loop iteration, a tile that fits the SMs'
# registers with up to 64 query rows (the reference picks its own, for the CPU).
KERNEL_PAGES_PER_BLOCK = 8


def cached_attention(q, k_pages, v_pages, page_table, lengths, *, layer: int,
                     pages_per_block: int, implementation: Implementation | None = None):
    """Attention partials over the cached slots (`jaxspec.device.attention.cached_attention`)
    by the chosen implementation; the kernel loads `KERNEL_PAGES_PER_BLOCK` pages per step.

    Returns:
      `(acc f32[B, Hkv, Q, D], m f32[B, Hkv, Q], l f32[B, Hkv, Q])`.
    """
    return _dispatch(implementation, ("paged_attention", "cached_attention"),
                     attention.cached_attention, q, k_pages, v_pages, page_table, lengths,
                     layer=layer, pages_per_block=pages_per_block,
                     kernel_kwargs=dict(pages_per_block=KERNEL_PAGES_PER_BLOCK))


def paged_attention(q, k_new, v_new, kv: kv_cache.KVPages, layer: int,
                    view: kv_cache.CacheView):
    """`jaxspec.device.attention.paged_attention` with the cached part by
    `view.implementation`: what a model calls."""
    cached = functools.partial(cached_attention, implementation=view.implementation)
    return attention.paged_attention(q, k_new, v_new, kv, layer, view, cached=cached)
