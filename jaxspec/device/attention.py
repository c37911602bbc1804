"""Grouped-query attention of T new tokens over the paged cache plus themselves.

The new tokens' keys are not written to the cache before attention: each query attends to the
cached slots below its row's length and, causally, to the new keys held in registers. So one
forward never reads what it writes, and the cache write happens once, after all layers.
"""

import jax
import jax.numpy as jnp
import numpy as np

from jaxspec.device import kv_cache

# Large finite negative instead of -inf: a fully masked row stays NaN-free (padding rows).
MASK_VALUE = -0.7 * float(np.finfo(np.float32).max)


def paged_attention(q: jax.Array, k_new: jax.Array, v_new: jax.Array, k_pages: jax.Array,
                    v_pages: jax.Array, view: kv_cache.CacheView) -> jax.Array:
    """Attention for one layer.

    Args:
      q: f32[B, T, Hq, D] queries of the new tokens (RoPE applied).
      k_new, v_new: f32[B, T, Hkv, D] keys (RoPE applied) and values of the new tokens.
      k_pages, v_pages: f32[num_pages, page_size, Hkv, D] this layer's cache pages.
      view: the rows' page tables and lengths.

    Returns:
      f32[B, T, Hq, D].
    """
    b, t, hq, d = q.shape
    hkv = k_new.shape[2]
    q = q.reshape(b, t, hkv, hq // hkv, d) * (d ** -0.5)
    k_old = kv_cache.gather_layer(k_pages, view.page_table)                     # [B, S, Hkv, D]
    v_old = kv_cache.gather_layer(v_pages, view.page_table)
    s = k_old.shape[1]

    scores_old = jnp.einsum("btkgd,bskd->bkgts", q, k_old)
    old_ok = jnp.arange(s)[None, :] < view.lengths[:, None]                     # [B, S]
    scores_old = jnp.where(old_ok[:, None, None, None, :], scores_old, MASK_VALUE)
    scores_new = jnp.einsum("btkgd,bukd->bkgtu", q, k_new)
    causal = jnp.arange(t)[None, :] <= jnp.arange(t)[:, None]                    # [T, U]
    scores_new = jnp.where(causal[None, None, None], scores_new, MASK_VALUE)

    probs = jax.nn.softmax(jnp.concatenate([scores_old, scores_new], axis=-1), axis=-1)
    out = (jnp.einsum("bkgts,bskd->btkgd", probs[..., :s], v_old)
           + jnp.einsum("bkgtu,bukd->btkgd", probs[..., s:], v_new))
    return out.reshape(b, t, hq, d)
