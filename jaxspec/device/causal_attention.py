"""Attention for `numerics="exact"`: every query computed alike in a plain step, a verify step,
a prompt chunk or any batch.

The fast path (attention.py) attends to the cached keys and, apart, to the new tokens' own keys,
in blocks whose size follows the number of queries, and merges the two: a query's sums then
depend on how many tokens its step holds. Here the new tokens' keys and values are written to the
cache first, and each query attends only to cached keys, up to its own position, in blocks and
splits at fixed absolute positions; a block past a query's last key leaves its partials exactly
as they were (its weights are exp(MASK - m) = 0), so the result for a query at position p is the
same float whatever else ran with it. The splits merge one after another, in order
(`merge_splits`), elementwise.

`causal_attention` here is the XLA reference of the Pallas kernel
`jaxspec.pallas_kernels.paged_attention.causal_attention` and the CPU path: one fixed-shape
program per (row, KV head, tile of QUERY_TILE queries), run one after another (`lax.map`), each
looping over blocks of `pages_per_block` pages.
"""

import functools

import jax
import jax.numpy as jnp

from jaxspec.device import attention
from jaxspec.device import kv_cache

QUERY_TILE = 16                  # the kernel's query tile
PAGES_PER_BLOCK = 8              # the kernel's block: 128 keys of 16-slot pages


@functools.partial(jax.jit, static_argnames=("layer", "num_new", "pages_per_block"))
def causal_attention(q, k_pages, v_pages, page_table, lengths, *, layer: int, num_new: int,
                     pages_per_block: int = PAGES_PER_BLOCK, tree=None):
    """Partials of each new query over the cached keys up to its position (one split); in a
    token tree, over the keys cached before the new ones and its ancestors' and its own.

    Args:
      q: f32[B, Hkv, Q, D] queries grouped by KV head, row `r = g * T + t` at position
        `lengths[b] + t`, scaled by `D ** -0.5`.
      k_pages, v_pages: [L, N, S, Hkv, D] every layer's pages, holding the new tokens too.
      page_table: i32[B, P]; lengths: i32[B] tokens cached before the new ones.
      layer: static layer index; num_new: static T.
      pages_per_block: static, pages per loop iteration.
      tree: bool[B, T, T] new token t sees new token u iff tree[b, t, u], or None: causally.

    Returns:
      `(acc f32[B, Hkv, 1, Q, D], m f32[B, Hkv, 1, Q], l f32[B, Hkv, 1, Q])`.
    """
    b, hkv, nq, d = q.shape
    page_size = k_pages.shape[2]
    block = pages_per_block * page_size
    tiles = -(-nq // QUERY_TILE)
    qt = jnp.pad(q, ((0, 0), (0, 0), (0, tiles * QUERY_TILE - nq), (0, 0)))
    width = page_table.shape[1]
    table = jnp.pad(page_table, ((0, 0), (0, -width % pages_per_block)),
                    constant_values=kv_cache.NULL_PAGE)

    def one(index):
        row, rest = jnp.divmod(index, hkv * tiles)
        head, tile = jnp.divmod(rest, tiles)
        queries = jax.lax.dynamic_slice(qt[row, head], (tile * QUERY_TILE, 0), (QUERY_TILE, d))
        r = tile * QUERY_TILE + jnp.arange(QUERY_TILE)
        limit = jnp.where(r < nq, lengths[row] + r % num_new + 1, 0)         # [QT]
        row_limit = jnp.minimum(lengths[row] + num_new, width * page_size)

        def fold(i, carry):
            acc, m, l = carry
            cols = jax.lax.dynamic_slice(table[row], (i * pages_per_block,), (pages_per_block,))
            k = k_pages[layer, cols, :, head].reshape(block, d).astype(jnp.float32)
            v = v_pages[layer, cols, :, head].reshape(block, d).astype(jnp.float32)
            pos = i * block + jnp.arange(block)
            visible = pos[None, :] < limit[:, None]
            if tree is not None:
                new = pos - lengths[row]
                sees = tree[row][(r % num_new)[:, None], jnp.clip(new, 0, num_new - 1)[None, :]]
                visible &= (new < 0)[None, :] | sees
            s = jnp.where(visible, queries @ k.T, attention.MASK_VALUE)
            m_next = jnp.maximum(m, jnp.max(s, axis=1))
            correction = jnp.exp(m - m_next)
            p = jnp.where(visible, jnp.exp(s - m_next[:, None]), 0.0)
            return (correction[:, None] * acc + p @ v, m_next,
                    correction * l + jnp.sum(p, axis=1))

        init = (jnp.zeros((QUERY_TILE, d), jnp.float32),
                jnp.full((QUERY_TILE,), attention.MASK_VALUE, jnp.float32),
                jnp.zeros((QUERY_TILE,), jnp.float32))
        return jax.lax.fori_loop(0, -(-row_limit // block), fold, init)

    acc, m, l = jax.lax.map(one, jnp.arange(b * hkv * tiles))
    acc = acc.reshape(b, hkv, 1, tiles * QUERY_TILE, d)[:, :, :, :nq]
    m, l = (x.reshape(b, hkv, 1, tiles * QUERY_TILE)[:, :, :, :nq] for x in (m, l))
    return acc, m, l


def merge_splits(acc: jax.Array, m: jax.Array, l: jax.Array) -> jax.Array:
    """Attention from per-split partials, folding the splits in order.

    Elementwise only, one split after another: no reduction whose order XLA could choose by
    shape. A split without visible keys (`m = MASK_VALUE`, `acc = l = 0`) weighs exactly 0.

    Args:
      acc: f32[B, H, S, Q, D]; m, l: f32[B, H, S, Q].

    Returns:
      f32[B, H, Q, D]; zero for a query without any visible key (padding).
    """
    acc_all, m_all, l_all = acc[:, :, 0], m[:, :, 0], l[:, :, 0]
    for s in range(1, acc.shape[2]):
        m_next = jnp.maximum(m_all, m[:, :, s])
        a, c = jnp.exp(m_all - m_next), jnp.exp(m[:, :, s] - m_next)
        acc_all = a[..., None] * acc_all + c[..., None] * acc[:, :, s]
        l_all = a * l_all + c * l[:, :, s]
        m_all = m_next
    return jnp.where(l_all[..., None] > 0, acc_all / jnp.maximum(l_all, 1e-30)[..., None], 0.0)


def exact_attention(q: jax.Array, k_new: jax.Array, v_new: jax.Array, kv: kv_cache.KVPages,
                    layer: int, view: kv_cache.CacheView, *, partials=causal_attention
                    ) -> tuple[jax.Array, kv_cache.KVPages]:
    """One layer's attention in exact mode: writes the new keys and values, then attends (models
    call `jaxspec.device.ops.exact_attention`, which picks the implementation of the partials).

    Args:
      q: [B, T, Hq, D] queries (RoPE applied); k_new, v_new: [B, T, Hkv, D].
      kv: every layer's pages; layer: static index; view: the rows' tables and lengths.
      partials: computes the per-split partials (`causal_attention`'s contract).

    Returns:
      ([B, T, Hq, D] in q's dtype, the pages with this layer's new slots written).
    """
    b, t, hq, d = q.shape
    hkv = k_new.shape[2]
    g = hq // hkv
    kv = kv_cache.write_layer(kv, layer, k_new, v_new, view)
    qh = jnp.transpose(q.astype(jnp.float32).reshape(b, t, hkv, g, d), (0, 2, 3, 1, 4))
    qh = qh.reshape(b, hkv, g * t, d) * (d ** -0.5)
    out = merge_splits(*partials(qh, kv.k, kv.v, view.page_table, view.lengths, layer=layer,
                                 num_new=t, tree=view.tree)).reshape(b, hkv, g, t, d)
    return jnp.transpose(out, (0, 3, 1, 2, 4)).reshape(b, t, hq, d).astype(q.dtype), kv
