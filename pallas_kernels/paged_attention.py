"""Pallas Triton kernel: online-softmax partials of decode/verify attention over the paged cache.

Reference (same contract, and the CPU path): `jaxspec.device.attention.cached_attention`; the cache
layout is documented in `jaxspec.device.kv_cache`.

One program per (row, KV head, split), flash-decoding style. Each split takes an equal share of
its row's live page blocks (`cdiv(min(length, P * S), S * pages_per_block)` blocks, counted in the
kernel from `lengths`), so the cost follows the cached length, never the page-table width, and a
small batch still spreads its context over the whole GPU. A program walks its blocks with an
online softmax: per block it reads the block's page ids from the table, gathers the
`pages_per_block * S` keys and values of its KV head with masked loads (positions at or past the
length are never read), scores all `Q = G * T` query rows at once, and rescales its running
`(acc, m, l)`. The wrapper merges the splits' partials with one more rescale. `attention_partials`
(the fast path's attention, reference `jaxspec.device.attention.attention_partials`) also takes
the T new tokens' keys and values: the last split of every (row, KV head) folds them in as one
more block, masked causally (query row `g * T + t` sees new keys 0..t) or by a token tree's
mask (`jaxspec.device.tree`: its ancestors and itself), expanded to the query rows by the wrapper.
"""

import functools

import jax
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu
import jax.numpy as jnp
import numpy as np

# Equal to `jaxspec.device.attention.MASK_VALUE`, defined here so the kernel never imports the
# module that dispatches to it: a large finite negative, so a fully masked row stays NaN-free.
MASK_VALUE = -0.7 * float(np.finfo(np.float32).max)
# Triton's dot needs every dimension >= 16, and every tensor a power-of-2 size.
MIN_DOT_DIM = 16
# More query rows than this would keep a [Q, S * pages_per_block] score tile and a [Q, D]
# accumulator in registers at once and spill; such models fall back to XLA.
MAX_QUERY_ROWS = 128
# Programs to aim for: about two waves over the 132 SMs of an H100/H200. Fewer (a small batch)
# leave SMs idle for the whole context; more only add partials to combine.
TARGET_PROGRAMS = 256
# (num_warps, num_stages) per page dtype, measured on an H200 at SmolLM2's shapes, batch 1, 2k
# cached tokens, 30 layers (`benchmarks.attention_tuning`, us per layer): float32 pages (4, 2)
# 14.9 (causal 20.4); bfloat16 pages (4, 2) 57.9 (93.9), (4, 1) 64.1 (36.7), (8, 1) 14.6 (22.1):
# the narrower gathers need twice the warps and no software pipelining.
LAUNCH = {"float32": (4, 2), "bfloat16": (8, 1)}
# More query rows than this (long verify windows) take 8 warps whatever the dtype.
SMALL_Q = 32
# f32 dots in IEEE precision, not TF32 (Triton's default): TF32's 10-bit mantissa would let the
# kernel's scores drift from the XLA path's, and with them the greedy tokens.
PRECISION = lax.Precision.HIGHEST
PAGE_DTYPES = (jnp.dtype(jnp.float32), jnp.dtype(jnp.bfloat16))


def _dot(a, b, *, trans_b: bool = False):
    """`a @ b` (or `a @ b.T`) of two f32 tiles, accumulated in f32."""
    contract = ((1,), (1,)) if trans_b else ((1,), (0,))
    return lax.dot_general(a, b, (contract, ((), ())), precision=PRECISION,
                           preferred_element_type=jnp.float32)


def _load_block(k_pages_ref, v_pages_ref, page_table_ref, *, layer, row, head, block,
                pages_per_block: int, readable_below):
    """Block `block` of `pages_per_block` pages of a row's keys and values for one KV head, as
    f32 [block_k, D] each, and the positions they hold [block_k]. Slots at or past
    `readable_below` are never read (zeros): pages past a row's end hold garbage (page 0) or
    stale slots, and even NaNs there cannot reach the sums."""
    _, num_pages, page_size, _, head_dim = k_pages_ref.shape
    table_width = page_table_ref.shape[1]
    offsets = jnp.arange(pages_per_block * page_size, dtype=jnp.int32)
    pos = block * pages_per_block * page_size + offsets
    col = jnp.minimum(block * pages_per_block + offsets // page_size, table_width - 1)
    page = jnp.clip(page_table_ref[row, col], 0, num_pages - 1)
    # Array indices on every gathered dim (the interpreter's masked load takes no slices).
    dims = jnp.arange(head_dim, dtype=jnp.int32)
    index = (layer, page[:, None], (offsets % page_size)[:, None], head, dims[None, :])
    readable = (pos < readable_below)[:, None]
    k = plgpu.load(k_pages_ref.at[index], mask=readable, other=0.0)
    v = plgpu.load(v_pages_ref.at[index], mask=readable, other=0.0)
    return pos, k.astype(jnp.float32), v.astype(jnp.float32)


def _fold_new_tokens(q, k_new_ref, v_new_ref, *tree_ref, carry, row, head, num_new: int, fold):
    """Folds the new keys at or before each query's own token (with `tree_ref`, i32[B, Qp, Tp],
    those it marks) into its partials where `fold` (else leaves them exactly as they are):
    query r is new token r % T."""
    acc, m_i, l_i = carry
    k = k_new_ref[row, head, :, :].astype(jnp.float32)                     # [Tp, D]
    v = v_new_ref[row, head, :, :].astype(jnp.float32)
    if tree_ref:
        visible = (tree_ref[0][row, :, :] != 0) & fold                     # [Qp, Tp]
    else:
        token = jnp.arange(q.shape[0], dtype=jnp.int32) % num_new          # [Qp]
        visible = (jnp.arange(k.shape[0], dtype=jnp.int32)[None, :] <= token[:, None]) & fold
    scores = jnp.where(visible, _dot(q, k, trans_b=True), MASK_VALUE)      # [Qp, Tp]
    m_next = jnp.maximum(m_i, scores.max(axis=1))
    correction = jnp.exp(m_i - m_next)
    p = jnp.where(visible, jnp.exp(scores - m_next[:, None]), 0.0)
    return correction[:, None] * acc + _dot(p, v), m_next, correction * l_i + p.sum(axis=1)


def _cached_attention_kernel(
    # inputs
    layer_ref,        # i32[1]
    q_ref,            # f32[B, Hkv, Qp, D]
    k_pages_ref,      # [L, N, S, Hkv, D]
    v_pages_ref,      # [L, N, S, Hkv, D]
    page_table_ref,   # i32[B, P]
    lengths_ref,      # i32[B]
    *refs,            # with num_new: k_new, v_new [B, Hkv, Tp, D] (and a tree's i32[B, Qp, Tp]);
                      # then the outputs: acc f32[B, Hkv, splits, Qp, D], m and l
                      # f32[B, Hkv, splits, Qp]
    pages_per_block: int, num_splits: int, num_new: int,
):
    new_refs, (acc_ref, m_ref, l_ref) = refs[:-3], refs[-3:]
    row, head, split = pl.program_id(0), pl.program_id(1), pl.program_id(2)
    page_size = k_pages_ref.shape[2]
    block_k = pages_per_block * page_size
    q = q_ref[row, head, :, :]                                              # [Qp, D]
    # A length past the table can only be read up to the table's end, as in the reference.
    length = jnp.clip(lengths_ref[row], 0, page_table_ref.shape[1] * page_size)
    live_blocks = pl.cdiv(length, block_k)
    per_split = pl.cdiv(live_blocks, num_splits)
    first = jnp.minimum(split * per_split, live_blocks)
    last = jnp.minimum(first + per_split, live_blocks)

    def body(block, carry):
        acc, m_i, l_i = carry
        pos, k, v = _load_block(k_pages_ref, v_pages_ref, page_table_ref, layer=layer_ref[0],
                                row=row, head=head, block=block,
                                pages_per_block=pages_per_block, readable_below=length)
        scores = _dot(q, k, trans_b=True)                                   # [Qp, block_k]
        scores = jnp.where((pos < length)[None, :], scores, MASK_VALUE)
        m_next = jnp.maximum(m_i, scores.max(axis=1))
        # Every block holds at least one live key, so m_next is a real score: both exps below
        # are exactly 0 where masked (and for the initial m = MASK_VALUE).
        correction = jnp.exp(m_i - m_next)
        p = jnp.exp(scores - m_next[:, None])
        l_i = correction * l_i + p.sum(axis=1)
        acc = correction[:, None] * acc + _dot(p, v)
        return acc, m_next, l_i

    acc = jnp.zeros(q.shape, jnp.float32)
    m_i = jnp.full(q.shape[:1], MASK_VALUE, jnp.float32)
    l_i = jnp.zeros(q.shape[:1], jnp.float32)
    acc, m_i, l_i = lax.fori_loop(first, last, body, (acc, m_i, l_i))
    if num_new:
        # The last split takes the new tokens: one small masked dot in every other program
        # costs less than a branch, and leaves their partials bit for bit as they were.
        acc, m_i, l_i = _fold_new_tokens(q, *new_refs, carry=(acc, m_i, l_i), row=row,
                                         head=head, num_new=num_new,
                                         fold=split == num_splits - 1)
    acc_ref[row, head, split, :, :] = acc
    m_ref[row, head, split, :] = m_i
    l_ref[row, head, split, :] = l_i


def static_validate(q, k_pages, v_pages, page_table, lengths, *, layer: int,
                    pages_per_block: int, max_query_rows: int | None = MAX_QUERY_ROWS) -> None:
    """Checks shapes and dtypes before tracing.

    Raises:
      ValueError: for inconsistent shapes or dtypes, naming the values.
      NotImplementedError: for inputs this kernel does not take (the switch falls back to XLA).
    """
    if q.ndim != 4 or k_pages.ndim != 5:
        raise ValueError(f"q must be [B, Hkv, Q, D] and k_pages [L, N, S, Hkv, D], got shapes "
                         f"{q.shape} and {k_pages.shape}")
    if k_pages.shape != v_pages.shape or k_pages.dtype != v_pages.dtype:
        raise ValueError(f"k_pages and v_pages differ: {k_pages.shape} {k_pages.dtype} vs "
                         f"{v_pages.shape} {v_pages.dtype}")
    rows, kv_heads, query_rows, head_dim = q.shape
    num_layers, _, page_size, page_kv_heads, page_head_dim = k_pages.shape
    if (kv_heads, head_dim) != (page_kv_heads, page_head_dim):
        raise ValueError(f"q has {kv_heads} KV heads of dim {head_dim}, the pages "
                         f"{page_kv_heads} of dim {page_head_dim}")
    if page_table.ndim != 2 or page_table.shape[0] != rows or lengths.shape != (rows,):
        raise ValueError(f"page_table must be [B, P] and lengths [B] with B = {rows}, got "
                         f"{page_table.shape} and {lengths.shape}")
    if page_table.dtype != jnp.int32 or lengths.dtype != jnp.int32:
        raise ValueError(f"page_table and lengths must be int32, got {page_table.dtype} and "
                         f"{lengths.dtype}")
    if q.dtype != jnp.float32:
        raise ValueError(f"q must be float32, got {q.dtype}")
    if not 0 <= layer < num_layers:
        raise ValueError(f"layer {layer} out of range for {num_layers} layers")
    if pages_per_block < 1:
        raise ValueError(f"pages_per_block must be >= 1, got {pages_per_block}")
    if k_pages.dtype not in PAGE_DTYPES:
        raise NotImplementedError(f"pages of dtype {k_pages.dtype}: the kernel takes "
                                  f"{[str(d) for d in PAGE_DTYPES]}")
    block_k = page_size * pages_per_block
    for name, size in (("head_dim", head_dim), ("page_size * pages_per_block", block_k)):
        if size < MIN_DOT_DIM or size & (size - 1):
            raise NotImplementedError(f"{name} = {size}: Triton tiles need a power of 2 >= "
                                      f"{MIN_DOT_DIM}")
    if max_query_rows is not None and query_rows > max_query_rows:
        raise NotImplementedError(f"{query_rows} query rows per KV head (G * T) > "
                                  f"{max_query_rows}")
    if rows == 0 or kv_heads == 0:
        raise NotImplementedError(f"empty grid: {rows} rows x {kv_heads} KV heads")


def _check_tree(tree, rows: int, num_new: int) -> None:
    """ValueError unless `tree` is None or bool[rows, T, T]."""
    if tree is not None and (tree.shape != (rows, num_new, num_new) or tree.dtype != jnp.bool_):
        raise ValueError(f"tree must be bool[{rows}, {num_new}, {num_new}], got {tree.dtype}"
                         f"{list(tree.shape)}")


def default_num_splits(rows: int, kv_heads: int, table_width: int, pages_per_block: int) -> int:
    """Splits per (row, KV head): enough programs to fill the GPU, at most one per block."""
    return max(1, min(pl.cdiv(table_width, pages_per_block),
                      TARGET_PROGRAMS // (rows * kv_heads)))


def _query_rows_tree(tree, query_rows: int, padded_rows: int, padded_new: int):
    """A token tree's mask (bool[B, T, T]) per query row: i32[B, padded_rows, padded_new], row
    `g * T + t` being token t's row, zero in the padding."""
    num_new = tree.shape[1]
    rows = tree[:, jnp.arange(query_rows) % num_new].astype(jnp.int32)     # [B, Q, T]
    return jnp.pad(rows, ((0, 0), (0, padded_rows - query_rows), (0, padded_new - num_new)))


def cached_attention_call(q, k_pages, v_pages, page_table, lengths, *, layer: int,
                          pages_per_block: int, num_splits: int, interpret: bool,
                          k_new=None, v_new=None, tree=None):
    """The `pallas_call` over `num_splits` splits per (row, KV head), then the combine.

    Same arguments and results as `cached_attention` (validated there), which jits this; with
    `k_new`, `v_new` (and `tree`) those of `attention_partials` (validated there).
    """
    rows, kv_heads, query_rows, head_dim = q.shape
    if page_table.shape[1] == 0:  # nothing can be cached: every row is empty
        return (jnp.zeros(q.shape, jnp.float32),
                jnp.full(q.shape[:3], MASK_VALUE, jnp.float32),
                jnp.zeros(q.shape[:3], jnp.float32))
    padded_rows = max(MIN_DOT_DIM, pl.next_power_of_2(query_rows))
    q = jnp.pad(q, ((0, 0), (0, 0), (0, padded_rows - query_rows), (0, 0)))
    new = ()
    num_new = 0 if k_new is None else k_new.shape[2]
    if num_new:
        padded_new = max(MIN_DOT_DIM, pl.next_power_of_2(num_new))
        pad = ((0, 0), (0, 0), (0, padded_new - num_new), (0, 0))
        new = (jnp.pad(k_new, pad), jnp.pad(v_new, pad))
        if tree is not None:
            new += (_query_rows_tree(tree, query_rows, padded_rows, padded_new),)
    partial_shape = (rows, kv_heads, num_splits, padded_rows)
    num_warps, num_stages = LAUNCH[jnp.dtype(k_pages.dtype).name]
    num_warps = num_warps if padded_rows <= SMALL_Q else max(num_warps, 8)
    kernel = functools.partial(_cached_attention_kernel, pages_per_block=pages_per_block,
                               num_splits=num_splits, num_new=num_new)
    acc, m_s, l_s = pl.pallas_call(
        kernel,
        grid=(rows, kv_heads, num_splits),
        out_shape=[jax.ShapeDtypeStruct((*partial_shape, head_dim), jnp.float32),   # acc
                   jax.ShapeDtypeStruct(partial_shape, jnp.float32),                # m
                   jax.ShapeDtypeStruct(partial_shape, jnp.float32)],               # l
        compiler_params=plgpu.CompilerParams(num_warps=num_warps, num_stages=num_stages),
        interpret=interpret,
        # The layer is an operand, not a constant: every layer lowers to the same Triton IR.
        name=f"cached_attention_{pages_per_block=}_{num_splits=}_{num_new=}",
    )(jnp.full((1,), layer, jnp.int32), q, k_pages, v_pages, page_table, lengths, *new)
    # Per split: acc [B, Hkv, splits, Q, D], m_s and l_s [B, Hkv, splits, Q].
    acc, m_s, l_s = (x[:, :, :, :query_rows] for x in (acc, m_s, l_s))
    if num_splits == 1:
        return acc[:, :, 0], m_s[:, :, 0], l_s[:, :, 0]
    # Splits without live blocks hold (0, MASK_VALUE, 0): their weight is 0 beside any real max,
    # and 1 when the whole row is empty, which keeps acc = l = 0 there.
    m = m_s.max(axis=2)
    weight = jnp.exp(m_s - m[:, :, None])
    return (weight[..., None] * acc).sum(axis=2), m, (weight * l_s).sum(axis=2)


@functools.partial(jax.jit, static_argnames=("layer", "pages_per_block", "interpret"))
def cached_attention(q, k_pages, v_pages, page_table, lengths, *, layer: int,
                     pages_per_block: int, interpret: bool = False):
    """Online-softmax partials of attention over each row's cached slots.

    Args:
      q: f32[B, Hkv, Q, D] queries grouped by KV head (`Q = G * T`: the G query heads sharing a
        KV head times the T new tokens), already scaled by `D ** -0.5`.
      k_pages, v_pages: [L, N, S, Hkv, D] every layer's pages, f32 or bf16.
      page_table: i32[B, P] page ids of each row; entries past the row's length may point at the
        garbage page 0.
      lengths: i32[B] cached tokens per row; keys at positions >= lengths[b] are masked.
      layer: static layer index.
      pages_per_block: static, pages loaded per loop iteration (`S * pages_per_block` must be a
        power of 2 >= 16).
      interpret: run the kernel in the Pallas interpreter (any backend; slow, for tests).

    Returns:
      `(acc f32[B, Hkv, Q, D], m f32[B, Hkv, Q], l f32[B, Hkv, Q])`: `m` the max score
      (MASK_VALUE where a row has no cached key), `l = sum_s exp(score_s - m)` and
      `acc = sum_s exp(score_s - m) * v_s`; a row of length 0 gives `(0, MASK_VALUE, 0)`.

    Raises:
      ValueError: for inconsistent shapes or dtypes.
      NotImplementedError: for page dtypes other than f32/bf16, a head dim or block that is not
        a power of 2 >= 16, more than `MAX_QUERY_ROWS` query rows, or an empty batch.
    """
    static_validate(q, k_pages, v_pages, page_table, lengths, layer=layer,
                    pages_per_block=pages_per_block)
    num_splits = default_num_splits(q.shape[0], q.shape[1], page_table.shape[1],
                                    pages_per_block)
    return cached_attention_call(q, k_pages, v_pages, page_table, lengths, layer=layer,
                                 pages_per_block=pages_per_block, num_splits=num_splits,
                                 interpret=interpret)


@functools.partial(jax.jit, static_argnames=("layer", "pages_per_block", "interpret"))
def attention_partials(q, k_new, v_new, k_pages, v_pages, page_table, lengths, *, layer: int,
                       pages_per_block: int, interpret: bool = False, tree=None):
    """Online-softmax partials of each new query over its row's cached slots and the new keys at
    or before its own token: `cached_attention` with the new tokens folded in by the last split
    of every (row, KV head), so a layer's attention is one kernel and one combine.

    Args:
      q: f32[B, Hkv, Q, D] as in `cached_attention`, row `r = g * T + t` being new token t.
      k_new, v_new: f32[B, Hkv, T, D] the new tokens' keys and values.
      k_pages, v_pages, page_table, lengths, layer, pages_per_block, interpret: as in
        `cached_attention`.
      tree: bool[B, T, T] new token t sees new token u iff tree[b, t, u] (a token tree,
        `jaxspec.device.tree`), or None: causally.

    Returns:
      `(acc, m, l)` as in `cached_attention`, over both parts.

    Raises:
      ValueError: as `cached_attention`, or new keys that do not match q.
      NotImplementedError: as `cached_attention`, or a table without columns.
    """
    static_validate(q, k_pages, v_pages, page_table, lengths, layer=layer,
                    pages_per_block=pages_per_block)
    rows, kv_heads, query_rows, head_dim = q.shape
    num_new = k_new.shape[2]
    if (k_new.shape != v_new.shape or k_new.shape[:2] != (rows, kv_heads)
            or k_new.shape[3] != head_dim or num_new == 0 or query_rows % num_new):
        raise ValueError(f"k_new and v_new must be [B, Hkv, T, D] with T dividing the "
                         f"{query_rows} query rows, got {k_new.shape} and {v_new.shape} for q "
                         f"{q.shape}")
    _check_tree(tree, rows, num_new)
    if page_table.shape[1] == 0:
        raise NotImplementedError("a page table without columns: nothing for a split to hold")
    num_splits = default_num_splits(rows, kv_heads, page_table.shape[1], pages_per_block)
    return cached_attention_call(q, k_pages, v_pages, page_table, lengths, layer=layer,
                                 pages_per_block=pages_per_block, num_splits=num_splits,
                                 interpret=interpret, k_new=k_new, v_new=v_new, tree=tree)


# ------------------------------------------------------------------ causal attention (exact)

# Keys per split of `causal_attention`: at least this many, doubled until a table has at most
# MAX_CAUSAL_SPLITS splits. Fixed by the table's width alone, so every call of an engine splits
# a row's keys at the same absolute positions.
MIN_SPLIT_KEYS = 256
MAX_CAUSAL_SPLITS = 16
# Query rows per program: the smallest Triton dot tile, whatever the number of queries.
QUERY_TILE = 16


def split_keys(table_keys: int) -> int:
    """Keys per split for a page table of `table_keys` slots."""
    keys = MIN_SPLIT_KEYS
    while pl.cdiv(table_keys, keys) > MAX_CAUSAL_SPLITS:
        keys *= 2
    return keys


def _causal_attention_kernel(
    # inputs
    layer_ref,        # i32[1]
    q_ref,            # f32[B, Hkv, Qp, D], Qp a multiple of QUERY_TILE
    k_pages_ref,      # [L, N, S, Hkv, D]
    v_pages_ref,      # [L, N, S, Hkv, D]
    page_table_ref,   # i32[B, P]
    lengths_ref,      # i32[B]
    *refs,            # a tree's i32[B, Qp, Tp] (`_query_rows_tree`), then the outputs:
                      # acc f32[B, Hkv, splits, Qp, D], m and l f32[B, Hkv, splits, Qp]
    pages_per_block: int, blocks_per_split: int, num_new: int, num_queries: int,
):
    tree_ref, (acc_ref, m_ref, l_ref) = refs[:-3], refs[-3:]
    row, head = pl.program_id(0), pl.program_id(1)
    tile, split = pl.program_id(2), pl.program_id(3)
    page_size, head_dim = k_pages_ref.shape[2], k_pages_ref.shape[4]
    block_k = pages_per_block * page_size
    queries = pl.ds(tile * QUERY_TILE, QUERY_TILE)
    q = q_ref[row, head, queries, :]                                        # [QT, D]
    # Query r of a KV head is new token r % T, at position length + r % T: it sees the keys
    # below length + r % T + 1, which the caller wrote before this call. Padding queries see none.
    r = tile * QUERY_TILE + jnp.arange(QUERY_TILE, dtype=jnp.int32)
    cached = lengths_ref[row]
    limit = jnp.where(r < num_queries, cached + r % num_new + 1, 0)       # [QT]
    row_limit = jnp.minimum(cached + num_new, page_table_ref.shape[1] * page_size)
    first = split * blocks_per_split
    last = jnp.minimum(first + blocks_per_split, pl.cdiv(row_limit, block_k))

    def body(block, carry):
        acc, m_i, l_i = carry
        pos, k, v = _load_block(k_pages_ref, v_pages_ref, page_table_ref, layer=layer_ref[0],
                                row=row, head=head, block=block,
                                pages_per_block=pages_per_block, readable_below=row_limit)
        visible = pos[None, :] < limit[:, None]                             # [QT, block_k]
        if tree_ref:
            # New keys only where the tree marks them: a gather of [QT, block_k] flags.
            new = pos - cached
            column = jnp.clip(new, 0, tree_ref[0].shape[2] - 1)
            marked = plgpu.load(tree_ref[0].at[row, r[:, None], column[None, :]])
            visible &= (new < 0)[None, :] | (marked != 0)
        scores = jnp.where(visible, _dot(q, k, trans_b=True), MASK_VALUE)
        m_next = jnp.maximum(m_i, scores.max(axis=1))
        # Masked keys weigh exp(MASK - m) = 0 beside any real score: a block past a query's
        # last key leaves its (acc, m, l) exactly as they were.
        correction = jnp.exp(m_i - m_next)
        p = jnp.where(visible, jnp.exp(scores - m_next[:, None]), 0.0)
        l_i = correction * l_i + p.sum(axis=1)
        acc = correction[:, None] * acc + _dot(p, v)
        return acc, m_next, l_i

    acc = jnp.zeros((QUERY_TILE, head_dim), jnp.float32)
    m_i = jnp.full((QUERY_TILE,), MASK_VALUE, jnp.float32)
    l_i = jnp.zeros((QUERY_TILE,), jnp.float32)
    acc, m_i, l_i = lax.fori_loop(first, last, body, (acc, m_i, l_i))
    acc_ref[row, head, split, queries, :] = acc
    m_ref[row, head, split, queries] = m_i
    l_ref[row, head, split, queries] = l_i


@functools.partial(jax.jit, static_argnames=("layer", "num_new", "pages_per_block",
                                             "interpret"))
def causal_attention(q, k_pages, v_pages, page_table, lengths, *, layer: int, num_new: int,
                     pages_per_block: int = 8, interpret: bool = False, tree=None):
    """Online-softmax partials of each new query over the cached keys up to its own position,
    split at fixed absolute positions: the exact mode's attention.

    The caller writes the T new tokens' keys and values into the pages first, so every key a
    query sees comes from the cache and a query's work depends only on its position: the same
    in a plain step, a verify step or a prompt chunk. Splits cover `split_keys(P * S)` keys
    each (fixed by the table's width), blocks `pages_per_block` pages; merge the splits with
    `jaxspec.device.attention.merge_splits`.

    Args:
      q: f32[B, Hkv, Q, D] queries grouped by KV head, row `r = g * T + t` being new token t
        (at position `lengths[b] + t`), scaled by `D ** -0.5`.
      k_pages, v_pages: [L, N, S, Hkv, D] every layer's pages, f32 or bf16, holding the new
        tokens too.
      page_table: i32[B, P]; lengths: i32[B] tokens cached before the new ones.
      layer: static layer index.
      num_new: static T, new tokens per row.
      pages_per_block: static, pages loaded per loop iteration.
      interpret: run the kernel in the Pallas interpreter.
      tree: bool[B, T, T] new token t sees new token u iff tree[b, t, u] (a token tree), or
        None: causally.

    Returns:
      `(acc f32[B, Hkv, splits, Q, D], m f32[B, Hkv, splits, Q], l f32[B, Hkv, splits, Q])`
      per split; a split without a visible key gives `(0, MASK_VALUE, 0)`.

    Raises:
      ValueError / NotImplementedError: as `cached_attention`.
    """
    # Queries run in tiles, so any number of them fits.
    static_validate(q, k_pages, v_pages, page_table, lengths, layer=layer,
                    pages_per_block=pages_per_block, max_query_rows=None)
    rows, kv_heads, num_queries, head_dim = q.shape
    if num_queries % num_new:
        raise ValueError(f"{num_queries} query rows are not G x {num_new} new tokens")
    _check_tree(tree, rows, num_new)
    page_size = k_pages.shape[2]
    block_k = page_size * pages_per_block
    table_keys = page_table.shape[1] * page_size
    per_split = max(1, split_keys(table_keys) // block_k)
    num_splits = max(1, pl.cdiv(pl.cdiv(table_keys, block_k), per_split))
    padded = pl.cdiv(num_queries, QUERY_TILE) * QUERY_TILE
    q = jnp.pad(q, ((0, 0), (0, 0), (0, padded - num_queries), (0, 0)))
    extra = () if tree is None else (_query_rows_tree(
        tree, num_queries, padded, max(MIN_DOT_DIM, pl.next_power_of_2(num_new))),)
    partial_shape = (rows, kv_heads, num_splits, padded)
    kernel = functools.partial(_causal_attention_kernel, pages_per_block=pages_per_block,
                               blocks_per_split=per_split, num_new=num_new,
                               num_queries=num_queries)
    acc, m, l = pl.pallas_call(
        kernel,
        grid=(rows, kv_heads, padded // QUERY_TILE, num_splits),
        out_shape=[jax.ShapeDtypeStruct((*partial_shape, head_dim), jnp.float32),   # acc
                   jax.ShapeDtypeStruct(partial_shape, jnp.float32),                # m
                   jax.ShapeDtypeStruct(partial_shape, jnp.float32)],               # l
        compiler_params=plgpu.CompilerParams(
            num_warps=LAUNCH[jnp.dtype(k_pages.dtype).name][0],
            num_stages=LAUNCH[jnp.dtype(k_pages.dtype).name][1]),
        interpret=interpret,
        name=f"causal_attention_{pages_per_block=}_{per_split=}",
    )(jnp.full((1,), layer, jnp.int32), q, k_pages, v_pages, page_table, lengths, *extra)
    return tuple(x[:, :, :, :num_queries] for x in (acc, m, l))
