"""Grouped-query attention of T new tokens over the paged cache plus themselves.

The new tokens' keys are not written to the cache before attention: each query attends to the
cached slots below its row's length and, causally, to the new keys it holds. So one forward never
reads what it writes, and the cache write happens once, after all layers.

Layout: the G query heads that share a KV head are stacked along the query axis
(`[B, Hkv, G * T, D]`), so every score is one batched matmul per (row, KV head) with no copy of
the keys per query head. The softmax runs over the two key blocks (cached, new) with a shared max
instead of concatenating them. A view with `read_cols == 0` (a first prompt chunk) skips the cached
block entirely.
"""

import jax
import jax.numpy as jnp
import numpy as np

from jaxspec.device import kv_cache

# Large finite negative instead of -inf: a fully masked row stays NaN-free (padding rows).
MASK_VALUE = -0.7 * float(np.finfo(np.float32).max)


def paged_attention(q: jax.Array, k_new: jax.Array, v_new: jax.Array, kv: kv_cache.KVPages,
                    layer: int, view: kv_cache.CacheView) -> jax.Array:
    """Attention for one layer.

    Args:
      q: f32[B, T, Hq, D] queries of the new tokens (RoPE applied).
      k_new, v_new: f32[B, T, Hkv, D] keys (RoPE applied) and values of the new tokens.
      kv: the cache pages of every layer.
      layer: static index of this layer's pages.
      view: the rows' page tables and lengths; attention reads `view.read_table`.

    Returns:
      f32[B, T, Hq, D].
    """
    b, t, hq, d = q.shape
    hkv = k_new.shape[2]
    g = hq // hkv
    qh = jnp.transpose(q.reshape(b, t, hkv, g, d), (0, 2, 3, 1, 4)).reshape(b, hkv, g * t, d)
    qh = qh * (d ** -0.5)
    kn = jnp.transpose(k_new, (0, 2, 1, 3))                              # [B, Hkv, T, D]
    vn = jnp.transpose(v_new, (0, 2, 1, 3))

    s_new = jnp.einsum("bhqd,bhud->bhqu", qh, kn)                         # [B, Hkv, G*T, T]
    query_pos = jnp.tile(jnp.arange(t), g)                                 # row g*T + t -> t
    causal = jnp.arange(t)[None, :] <= query_pos[:, None]                  # [G*T, T]
    s_new = jnp.where(causal[None, None], s_new, MASK_VALUE)
    m = jnp.max(s_new, axis=-1, keepdims=True)

    table = view.read_table
    if table.shape[1]:
        ko = jnp.transpose(kv_cache.gather_layer(kv.k, layer, table), (0, 2, 1, 3))  # [B,Hkv,S,D]
        vo = jnp.transpose(kv_cache.gather_layer(kv.v, layer, table), (0, 2, 1, 3))
        s_old = jnp.einsum("bhqd,bhsd->bhqs", qh, ko)                     # [B, Hkv, G*T, S]
        cached = jnp.arange(ko.shape[2])[None, :] < view.lengths[:, None]  # [B, S]
        s_old = jnp.where(cached[:, None, None, :], s_old, MASK_VALUE)
        m = jnp.maximum(m, jnp.max(s_old, axis=-1, keepdims=True))
        p_old, p_new = jnp.exp(s_old - m), jnp.exp(s_new - m)
        denom = jnp.sum(p_old, -1, keepdims=True) + jnp.sum(p_new, -1, keepdims=True)
        out = (jnp.einsum("bhqs,bhsd->bhqd", p_old, vo)
               + jnp.einsum("bhqu,bhud->bhqd", p_new, vn))
    else:
        p_new = jnp.exp(s_new - m)
        denom = jnp.sum(p_new, -1, keepdims=True)
        out = jnp.einsum("bhqu,bhud->bhqd", p_new, vn)
    out = (out / denom).reshape(b, hkv, g, t, d)
    return jnp.transpose(out, (0, 3, 1, 2, 4)).reshape(b, t, hq, d)
