"""Paged KV cache: fixed-size pages shared by all sequences, addressed through a page table.

Vocabulary:
  page        `page_size` consecutive token slots of every layer's K and V.
  page table  per batch row, the pages holding that sequence, in order: token position `p` lives in
              page `page_table[b, p // page_size]` at offset `p % page_size`.
  length      tokens of the sequence already in the cache (`lengths[b]`); the next forward writes
              its first new token at position `lengths[b]`.
  NULL_PAGE   page 0 is never handed out. Unallocated page-table entries point at it, and writes of
              padding tokens go to it, so a padded batch row or padded position can never touch a
              page that belongs to another sequence. Its contents are garbage and always masked.

The page allocator lives on the host (`jaxspec.host.kv_pages`); this module is pure functions.

One forward writes T new tokens per row at positions `lengths[b] .. lengths[b] + T - 1` (T = 1 for
plain decode, 1 + K when verifying K drafts). Attention reads cached keys below `lengths[b]` plus
the new keys causally, so stale slots past the length are never seen. Rollback is therefore only a
length reset, done on the host:

    page_size = 4, K = 3, page_table[b] = [7, 3, 5, 0]          (0 = NULL_PAGE)

    before:  page 7 [p0 p1 p2 p3]  page 3 [p4 .  .  . ]  length = 5; last token t not yet cached
             (the host allocated pages for length + 1 + K = 9 slots before the step: page 5)
    verify:  feed [t d0 d1 d2] -> positions 5..8:  page 3 [p4 t  d0 d1]  page 5 [d2 .  .  . ]
    accept:  d0 accepted, d1 rejected; the bonus token x comes from the logits at d0
    after:   length = 5 + 1 + 1 = 7 (t and d0 committed), next input x; slots 7..8 (d1 d2) are
             stale but masked, and the next forward overwrites them. Page 5 stays with the
             sequence (the next step writes there again); all its pages return to the allocator
             when it finishes.
"""

from typing import Any

import flax.struct
import jax
import jax.numpy as jnp

NULL_PAGE = 0


@flax.struct.dataclass
class KVPages:
    """The K and V pages of every layer.

    Attributes:
      k: [num_layers, num_pages, page_size, num_kv_heads, head_dim], float32 or bfloat16 (the
        cache's own dtype, which may differ from the model's: writes convert)
      v: the same for values.
    """

    k: jax.Array
    v: jax.Array

    @property
    def num_pages(self) -> int:
        return self.k.shape[1]

    @property
    def page_size(self) -> int:
        return self.k.shape[2]


@flax.struct.dataclass
class CacheView:
    """Which cache slots each batch row reads and writes in one forward.

    The table's width is a static compile bucket (the host gives every call the same lifetime
    width); what a forward reads follows `lengths`, not the width (see attention.py).

    Attributes:
      page_table: i32[B, P] pages of each row's sequence; NULL_PAGE where unallocated.
      lengths: i32[B] tokens already cached per row (position of the first new token).
      num_new: i32[B] valid new tokens per row, <= T; the rest are padding and are never written.
        A padding row has num_new = 0.
      implementation: static, how attention reads the pages: "pallas", "xla" or None (the
        kernel on GPU, the XLA loop elsewhere; `jaxspec.device.ops`).
      mesh: static, the device mesh the pages are sharded over, or None
        (`jaxspec.device.sharding`).
      numerics: static, "fast" (XLA's own choices) or "exact" (every row computed the same way
        whatever the number of rows in the call: `jaxspec.device.exact`).
      tree: bool[B, T, T] new token i attends to new token j (a token tree: j is i or one of
        its ancestors, `jaxspec.device.tree`), or None: causally, j <= i.
      depth: i32[B, T] with a tree, each new token's depth: its position is `lengths + depth`
        (None: `lengths + t`).
    """

    page_table: jax.Array
    lengths: jax.Array
    num_new: jax.Array
    implementation: str | None = flax.struct.field(pytree_node=False, default=None)
    mesh: Any = flax.struct.field(pytree_node=False, default=None)
    numerics: str = flax.struct.field(pytree_node=False, default="fast")
    tree: jax.Array | None = None
    depth: jax.Array | None = None

    def positions(self, num_tokens: int) -> jax.Array:
        """i32[B, T] the positions of the T new tokens (RoPE's, and the sampling keys')."""
        offsets = (jnp.arange(num_tokens, dtype=jnp.int32)[None, :] if self.depth is None
                   else self.depth)
        return self.lengths[:, None] + offsets


def init_pages(*, num_layers: int, num_pages: int, page_size: int, num_kv_heads: int,
               head_dim: int, dtype=jnp.float32) -> KVPages:
    """Zeroed pages. `num_pages` includes the NULL page."""
    shape = (num_layers, num_pages, page_size, num_kv_heads, head_dim)
    return KVPages(k=jnp.zeros(shape, dtype), v=jnp.zeros(shape, dtype))


def gather_layer(pages: jax.Array, layer: int, page_table: jax.Array) -> jax.Array:
    """One layer's slots of the pages in `page_table` (a row's pages, or a block of them), in order.

    Indexes layer and pages in one gather, so only the gathered pages are read (slicing the layer
    out first would copy all of its pages).

    Args:
      pages: f32[num_layers, num_pages, page_size, H, D] K or V.
      layer: static layer index.
      page_table: i32[B, P].

    Returns:
      [B, P * page_size, H, D]; slot s of row b is slot s of its pages' concatenation.
    """
    b, p = page_table.shape
    _, _, page_size, h, d = pages.shape
    return pages[layer, page_table].reshape(b, p * page_size, h, d)


def write_slots(view: CacheView, num_tokens: int, page_size: int) -> tuple[jax.Array, jax.Array]:
    """Where each of the T new tokens of each row is written: (page i32[B, T], offset i32[B, T]).

    Padding tokens (t >= num_new[b]) and positions past the page table go to NULL_PAGE.
    """
    t = jnp.arange(num_tokens, dtype=jnp.int32)[None, :]
    return _slots(view, t, t < view.num_new[:, None], page_size)


def _slots(view: CacheView, offsets: jax.Array, valid: jax.Array, page_size: int):
    """(page, offset) of slots `lengths + offsets` (i32[B, T]); invalid ones and those past the
    page table on NULL_PAGE."""
    pos = view.lengths[:, None] + offsets
    col = pos // page_size
    max_cols = view.page_table.shape[1]
    page = jnp.take_along_axis(view.page_table, jnp.minimum(col, max_cols - 1), axis=1)
    return jnp.where(valid & (col < max_cols), page, NULL_PAGE), pos % page_size


def move_slots(kv: KVPages, view: CacheView, sources: jax.Array, count: jax.Array) -> KVPages:
    """Moves every layer's keys and values of slots `lengths + sources[b, d]` to `lengths + d`,
    for d < count[b]: a tree's accepted path to the slots plain decoding would have used
    (`jaxspec.device.tree`). All sources are read before any slot is written.

    Args:
      kv: the pages.
      view: rows' page tables and lengths (those of the step that wrote the sources).
      sources: i32[B, T] the slot offset holding depth d's token.
      count: i32[B] slots to fill per row (0 for padding rows).
    """
    t = sources.shape[1]
    everywhere = jnp.ones(sources.shape, bool)
    src_page, src_offset = _slots(view, sources, everywhere, kv.page_size)
    offsets = jnp.arange(t, dtype=jnp.int32)[None, :]
    page, offset = _slots(view, offsets, offsets < count[:, None], kv.page_size)
    return KVPages(k=kv.k.at[:, page, offset].set(kv.k[:, src_page, src_offset]),
                   v=kv.v.at[:, page, offset].set(kv.v[:, src_page, src_offset]))


def write(kv: KVPages, new_k: jax.Array, new_v: jax.Array, view: CacheView) -> KVPages:
    """Writes every layer's new K/V at each row's current length (one scatter per tensor).

    Args:
      kv: the pages.
      new_k, new_v: f32[num_layers, B, T, H, D] keys/values of the T new tokens.
      view: rows' page tables, lengths and valid counts.
    """
    page, offset = write_slots(view, new_k.shape[2], kv.page_size)
    return KVPages(k=kv.k.at[:, page, offset].set(new_k.astype(kv.k.dtype)),
                   v=kv.v.at[:, page, offset].set(new_v.astype(kv.v.dtype)))


def write_layer(kv: KVPages, layer: int, new_k: jax.Array, new_v: jax.Array,
                view: CacheView) -> KVPages:
    """Writes one layer's new K/V at each row's current length (exact mode writes each layer
    before its attention reads them).

    Args:
      kv: the pages.
      layer: static layer index.
      new_k, new_v: [B, T, H, D] keys/values of the T new tokens.
      view: rows' page tables, lengths and valid counts.
    """
    page, offset = write_slots(view, new_k.shape[1], kv.page_size)
    return KVPages(k=kv.k.at[layer, page, offset].set(new_k.astype(kv.k.dtype)),
                   v=kv.v.at[layer, page, offset].set(new_v.astype(kv.v.dtype)))
