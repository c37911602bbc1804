"""Grouped-query attention of T new tokens over the paged cache plus themselves.

The new tokens' keys are not written to the cache before attention: each query attends to the
cached slots below its row's length and, causally, to the new keys it holds. So one forward never
reads what it writes, and the cache write happens once, after all layers.

Layout: the G query heads that share a KV head are stacked along the query axis
(`[B, Hkv, G * T, D]`), so every score is one batched matmul per (row, KV head) with no copy of
the keys per query head.

What a forward reads follows the live context, not the page table: `cached_attention` walks the
table in blocks of pages with an online softmax and stops after the block holding the longest
row's last cached slot. The trip count is a traced value, so one compilation serves every length;
the table's width (a lifetime-wide compile bucket) only bounds how far the loop may go. The two
parts, cached slots (c) and new tokens (n), are merged by log-sum-exp (`attention_partials`; the
GPU kernel folds the new tokens into its last split instead, one kernel per layer):

    m = max(m_c, m_n)
    out = (acc_c e^(m_c - m) + acc_n e^(m_n - m)) / (l_c e^(m_c - m) + l_n e^(m_n - m))
"""

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np

from jaxspec.device import kv_cache

# Large finite negative instead of -inf: a fully masked row stays NaN-free (padding rows).
MASK_VALUE = -0.7 * float(np.finfo(np.float32).max)

# Few query rows per KV head (decoding, verifying; Hkv * G * T <= BLOCK_DIAGONAL_MAX_ROWS): the
# loop is bound by reading K and V, and each iteration's fixed cost (a dozen XLA ops, ~20 us on 2
# busy cores) matters. Cached attention of SmolLM2-135M's 30 layers at T = 1 (2 shared CPU cores,
# min of 15): 16 pages 2.6 ms at 128 cached tokens, 26 ms at 4k; 64 pages 4.8 and 17 ms; 128 pages
# 8.7 and 17 ms. 64 costs one 1024-slot block at short contexts and no more at long ones.
DECODE_PAGES_PER_BLOCK = 64
# The last, partial block of the longest row runs in blocks of this many pages (or the largest
# divisor of pages_per_block below it). At 128 cached tokens a whole 64-page block cost 2.8x a
# 16-page one at T = 1 and 3.7x at T = 6; 8 pages saved nothing more at 128 and lost at 1000.
TAIL_PAGES_PER_BLOCK = 16
# Prompt chunks attend to their own tokens in query tiles of this many tokens, each over the keys
# up to its last token: 5/8 of the dense causal work at T = 512, 17/32 at 2048.
NEW_TOKEN_TILE = 128
# Many query rows (prompt chunks, and verify steps of K >= 7): compute-bound. 32 pages (a score
# block of [Hkv, G * 512, 512] f32, 9.4 MB, for a 512-token chunk) prefilled SmolLM2 on 2 quiet
# cores 3-4% faster than 16 at 4k tokens and 6% at 8k; 64 was slower; K = 8 and 16 verify steps
# at 512 and 1k tokens cost the same with 16 or 32.
PREFILL_PAGES_PER_BLOCK = 32
# Up to this many query rows in all (Hkv * Q), scores and weighted values are one plain matmul over
# all KV heads with a block-diagonal query matrix: Hkv times the flops of per-head matmuls, but
# keys and values are used in their page layout, where per-head matmuls first transpose every
# gathered block. Measured on SmolLM2 (Hkv = 3): 4x faster at T = 1 (9 rows), 1.3x at T = 6 (54
# rows), even at 81 rows, slower beyond.
BLOCK_DIAGONAL_MAX_ROWS = 64


def pages_per_block(num_kv_heads: int, num_queries: int) -> int:
    """The block size `paged_attention` uses for Q = G * T queries per KV head."""
    if num_kv_heads * num_queries <= BLOCK_DIAGONAL_MAX_ROWS:
        return DECODE_PAGES_PER_BLOCK
    return PREFILL_PAGES_PER_BLOCK


def block_loops(table_cols: int, page_size: int, pages_per_block: int, max_len):
    """How `cached_attention` walks a table of `table_cols` pages when its longest row holds
    `max_len` cached tokens (traced, or a Python int): None where the table is read whole without
    a loop (at most a tail block wide), else `(pages, tail, whole, stop)`, i.e. blocks
    0..whole-1 of `pages` pages (every whole block below the length), then blocks
    whole * pages // tail..stop-1 of `tail` pages (the rest, so the cost follows the length to
    within `tail` pages without a long loop of small blocks)."""
    tail = math.gcd(pages_per_block, TAIL_PAGES_PER_BLOCK)
    if table_cols <= tail:
        return None
    # A block as wide as the whole table is a loop-invariant slice: XLA hoists its gather out of
    # the loop and pays for it even when the loop runs no block (a plain step at 60 cached tokens
    # in an 8-page table took 50 ms instead of 28). Such tables go by tails.
    pages = tail if table_cols <= pages_per_block else pages_per_block
    max_len = jnp.minimum(max_len, (table_cols + -table_cols % pages) * page_size)
    return (pages, tail, max_len // (pages * page_size),
            (max_len + tail * page_size - 1) // (tail * page_size))


def cached_attention(q: jax.Array, k_pages: jax.Array, v_pages: jax.Array, page_table: jax.Array,
                     lengths: jax.Array, *, layer: int, pages_per_block: int
                     ) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Online-softmax partials of attention over each row's cached slots.

    The XLA implementation: a loop over the whole blocks of `pages_per_block` page-table columns
    below the longest row's length, then a loop over the rest in blocks of TAIL_PAGES_PER_BLOCK
    pages; both trip counts are traced values, so the cost follows the longest live row whatever
    the table's width (a table of at most TAIL_PAGES_PER_BLOCK pages is read whole, no loop).
    Each block's pages are gathered straight from the all-layer arrays
    (`kv_cache.gather_layer`).

    Args:
      q: f32[B, Hkv, Q, D] queries grouped by KV head (Q = G * T: the G query heads sharing a KV
        head, times the T new tokens), already scaled by D ** -0.5.
      k_pages, v_pages: [L, N, S, Hkv, D] every layer's pages (S = page_size), f32 or bf16;
        scores and sums accumulate in float32 either way.
      page_table: i32[B, P]; lengths: i32[B], keys at positions >= lengths[b] are masked.
      layer: static layer index.
      pages_per_block: static, pages per loop iteration.

    Returns:
      (acc f32[B, Hkv, Q, D] = sum_s exp(score_s - m) * v_s, m f32[B, Hkv, Q] the max score
      (MASK_VALUE where a row has no cached key), l f32[B, Hkv, Q] = sum_s exp(score_s - m)).
      Rows without cached keys have acc = 0 and l = 0.
    """
    b, hkv, nq, d = q.shape
    if page_table.shape[1] == 0:            # a table without columns caches nothing
        return (jnp.zeros(q.shape, jnp.float32), jnp.full(q.shape[:3], MASK_VALUE, jnp.float32),
                jnp.zeros(q.shape[:3], jnp.float32))
    rows = hkv * nq
    if rows <= BLOCK_DIAGONAL_MAX_ROWS:
        # qd[b, h * Q + i, h' * D + e] = q[b, h, i, e] if h == h' else 0, so a key row of all heads
        # ([Hkv * D], its page layout) times qd^T gives every head's score, and p times a value row
        # gives [rows, Hkv * D] whose diagonal blocks are the heads' weighted values.
        eye = jnp.eye(hkv, dtype=jnp.float32)
        qd = (q[:, :, :, None, :] * eye[None, :, None, :, None]).reshape(b, rows, hkv * d)

        def scores(k):                                                 # [B, rows, block]
            return jnp.einsum("bnc,bkc->bnk", qd, k.reshape(b, -1, hkv * d))

        def weighted(p, v):                                            # [B, rows, Hkv * D]
            return jnp.einsum("bnk,bkc->bnc", p, v.reshape(b, -1, hkv * d))

        def finish(acc):
            return jnp.sum(acc.reshape(b, hkv, nq, hkv, d) * eye[None, :, None, :, None], axis=3)

        acc_width = hkv * d
    else:
        def scores(k):
            return jnp.einsum("bhqd,bkhd->bhqk", q, k).reshape(b, rows, -1)

        def weighted(p, v):
            return jnp.einsum("bhqk,bkhd->bhqd", p.reshape(b, hkv, nq, -1), v).reshape(
                b, rows, d)

        def finish(acc):
            return acc.reshape(b, hkv, nq, d)

        acc_width = d

    page_size = k_pages.shape[2]
    loops = block_loops(page_table.shape[1], page_size, pages_per_block, jnp.max(lengths))
    pages = page_table.shape[1] if loops is None else loops[0]
    # The table padded to whole blocks with the null page (masked like any slot past the length).
    table = jnp.pad(page_table, ((0, 0), (0, -page_table.shape[1] % pages)),
                    constant_values=kv_cache.NULL_PAGE)

    def fold(i, carry, pages: int):
        """Folds block i of `pages` pages into the partials."""
        block = pages * page_size
        acc, m, l = carry
        cols = jax.lax.dynamic_slice_in_dim(table, i * pages, pages, axis=1)
        k = kv_cache.gather_layer(k_pages, layer, cols).astype(jnp.float32)  # [B,blk,Hkv,D]
        v = kv_cache.gather_layer(v_pages, layer, cols).astype(jnp.float32)
        cached = i * block + jnp.arange(block)[None, :] < lengths[:, None]   # [B, block]
        s = jnp.where(cached[:, None, :], scores(k), MASK_VALUE)
        m_next = jnp.maximum(m, jnp.max(s, axis=-1))
        p = jnp.exp(s - m_next[..., None])
        alpha = jnp.exp(m - m_next)
        return alpha[..., None] * acc + weighted(p, v), m_next, alpha * l + jnp.sum(p, axis=-1)

    def blocks(carry, start, stop, pages: int):
        """Folds blocks start..stop-1 of `pages` pages each into the partials."""
        return jax.lax.fori_loop(start, stop, functools.partial(fold, pages=pages), carry)

    carry = (jnp.zeros((b, rows, acc_width), jnp.float32),
             jnp.full((b, rows), MASK_VALUE, jnp.float32), jnp.zeros((b, rows), jnp.float32))
    if loops is None:
        # A table of a tail block or less is read whole, without a loop: the two loops' fixed
        # cost (30 layers at 60 cached tokens in 9 pages: 5-6 ms) exceeds reading it (1.7-2.4).
        acc, m, l = fold(0, carry, pages)
    else:
        _, tail, whole, stop = loops
        carry = blocks(carry, 0, whole, pages)
        acc, m, l = blocks(carry, whole * (pages // tail), stop, tail)
    # A row without cached keys saw only masked scores, and exp(MASK - MASK) = 1 counted them.
    has_keys = (lengths > 0)[:, None]
    acc = finish(jnp.where(has_keys[..., None], acc, 0.0))
    return acc, m.reshape(b, hkv, nq), jnp.where(has_keys, l, 0.0).reshape(b, hkv, nq)


def new_token_attention(q: jax.Array, k: jax.Array, v: jax.Array, *, num_groups: int,
                        tree: jax.Array | None = None
                        ) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Online-softmax partials of each new query over the new keys at or before its position
    (or, in a token tree, over its ancestors and itself).

    Queries run in tiles of NEW_TOKEN_TILE tokens, each over the keys up to its last token only,
    so a long prompt chunk skips most of the causal mask's upper triangle.

    Args:
      q: f32[B, Hkv, G * T, D] queries grouped by KV head (row g * T + t), scaled.
      k, v: f32[B, Hkv, T, D] the new keys and values.
      num_groups: G.
      tree: bool[B, T, T] new token t sees new token u iff tree[b, t, u] (a parent precedes its
        children, so u <= t), or None: causally.

    Returns:
      (acc f32[B, Hkv, G * T, D], m f32[B, Hkv, G * T], l f32[B, Hkv, G * T]) as in
      `cached_attention`.
    """
    b, hkv, _, d = q.shape
    t = k.shape[2]
    q = q.reshape(b, hkv, num_groups, t, d)
    tiles = []
    for start in range(0, t, NEW_TOKEN_TILE):
        stop = min(start + NEW_TOKEN_TILE, t)
        n = num_groups * (stop - start)
        s = jnp.einsum("bhqd,bhud->bhqu", q[:, :, :, start:stop].reshape(b, hkv, n, d),
                       k[:, :, :stop])                                     # [B, Hkv, n, stop]
        query_pos = jnp.tile(jnp.arange(start, stop), num_groups)          # row g*c + i -> start+i
        if tree is None:
            visible = (jnp.arange(stop)[None, :] <= query_pos[:, None])[None, None]
        else:
            visible = tree[:, query_pos, :stop][:, None]                  # [B, 1, n, stop]
        s = jnp.where(visible, s, MASK_VALUE)
        m = jnp.max(s, axis=-1)
        p = jnp.exp(s - m[..., None])
        acc = jnp.einsum("bhqu,bhud->bhqd", p, v[:, :, :stop])
        tiles.append((acc.reshape(b, hkv, num_groups, stop - start, d),
                      m.reshape(b, hkv, num_groups, stop - start),
                      jnp.sum(p, axis=-1).reshape(b, hkv, num_groups, stop - start)))
    acc, m, l = (jnp.concatenate(parts, axis=3) for parts in zip(*tiles, strict=True))
    return (acc.reshape(b, hkv, num_groups * t, d), m.reshape(b, hkv, num_groups * t),
            l.reshape(b, hkv, num_groups * t))


def attention_partials(q: jax.Array, k_new: jax.Array, v_new: jax.Array, k_pages: jax.Array,
                       v_pages: jax.Array, page_table: jax.Array, lengths: jax.Array, *,
                       layer: int, pages_per_block: int, tree: jax.Array | None = None
                       ) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Online-softmax partials of each new query over its row's cached slots and the new keys at
    or before its own position: `cached_attention` and `new_token_attention` merged.

    Args:
      q: f32[B, Hkv, G * T, D] queries grouped by KV head, row `g * T + t` being new token t,
        scaled by D ** -0.5.
      k_new, v_new: f32[B, Hkv, T, D] the new tokens' keys and values.
      k_pages, v_pages, page_table, lengths, layer, pages_per_block: as in `cached_attention`.
      tree: as in `new_token_attention`.

    Returns:
      (acc f32[B, Hkv, G * T, D], m f32[B, Hkv, G * T], l f32[B, Hkv, G * T]) as in
      `cached_attention`; every query sees at least its own key, so l > 0.
    """
    acc_new, m_new, l_new = new_token_attention(q, k_new, v_new,
                                                num_groups=q.shape[2] // k_new.shape[2],
                                                tree=tree)
    acc, m, l = cached_attention(q, k_pages, v_pages, page_table, lengths, layer=layer,
                                 pages_per_block=pages_per_block)
    m_all = jnp.maximum(m, m_new)
    a_cached, a_new = jnp.exp(m - m_all), jnp.exp(m_new - m_all)
    return (a_cached[..., None] * acc + a_new[..., None] * acc_new, m_all,
            a_cached * l + a_new * l_new)


def paged_attention(q: jax.Array, k_new: jax.Array, v_new: jax.Array, kv: kv_cache.KVPages,
                    layer: int, view: kv_cache.CacheView, *, partials=attention_partials
                    ) -> jax.Array:
    """Attention for one layer (models call `jaxspec.device.ops.paged_attention`, which picks
    the implementation of the cached part).

    Args:
      q: [B, T, Hq, D] queries of the new tokens (RoPE applied), in the model's dtype.
      k_new, v_new: [B, T, Hkv, D] keys (RoPE applied) and values of the new tokens.
      kv: the cache pages of every layer (their own dtype).
      layer: static index of this layer's pages.
      view: the rows' page tables, lengths and token tree.
      partials: computes the partials (`attention_partials`'s contract).

    Returns:
      [B, T, Hq, D] in q's dtype; scores, softmax and sums are float32 whatever the dtypes.
    """
    b, t, hq, d = q.shape
    hkv = k_new.shape[2]
    g = hq // hkv
    f32 = jnp.float32
    qh = jnp.transpose(q.astype(f32).reshape(b, t, hkv, g, d), (0, 2, 3, 1, 4))
    qh = qh.reshape(b, hkv, g * t, d) * (d ** -0.5)
    kn = jnp.transpose(k_new.astype(f32), (0, 2, 1, 3))                  # [B, Hkv, T, D]
    vn = jnp.transpose(v_new.astype(f32), (0, 2, 1, 3))

    acc, _, l = partials(qh, kn, vn, kv.k, kv.v, view.page_table, view.lengths, layer=layer,
                         pages_per_block=pages_per_block(hkv, g * t), tree=view.tree)
    out = (acc / l[..., None]).reshape(b, hkv, g, t, d)
    return jnp.transpose(out, (0, 3, 1, 2, 4)).reshape(b, t, hq, d).astype(q.dtype)
