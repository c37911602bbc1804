"""Token trees: several draft continuations verified in one step (`SAConfig(tree_budget=N)`).

A row's step input is `[t, d_1, ..., d_K]` as for a linear draft, but each draft node j names its
parent, the input it continues: `parents[j-1]` in `0 .. j-1` (0: the last committed token t, the
root). A linear draft is the chain `parents = [0, 1, ..., K-1]`.

    inputs   t   a   b   c   d          parents of a..d: [0, 1, 0, 3]
    tree     t - a - b                  depth:   t 0, a 1, b 2, c 1, d 2
              \\- c - d                  a node sees itself and its ancestors only

A node sits in the cache at slot `length + j` (its input index), but attends and takes its RoPE
position as if at `length + depth`: the tree's paths are verified side by side, each as the
sequence it would continue. Acceptance follows the target's own tokens down the tree: node j is
accepted iff its token is the target's choice after its parent and its parent is accepted; the
deepest accepted node's path is committed, plus the target's token after it (the bonus). Its
nodes' keys and values then move to the slots their depths give (`kv_cache.move_slots`), which
is where plain decoding would have written them.

Numerics: with `numerics="exact"` a node whose slot is not `length + depth` (any node off the
chain of first children) reads its ancestors' keys at other slots, in other blocks, than plain
decoding does, so its sums may differ from plain's in the last bits: a tree is verified as a
linear draft is in fast mode (the target's argmax of its own logits), not bit for bit.
"""

import jax
import jax.numpy as jnp


def _in_range(parents: jax.Array) -> jax.Array:
    """`parents` (i32[B, K]) with any parent outside `0 .. j-1` of node j read as the root."""
    node = jnp.arange(1, parents.shape[1] + 1, dtype=jnp.int32)[None, :]
    return jnp.where((parents >= 0) & (parents < node), parents, 0)


def ancestors(parents: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Each input's ancestors and depth.

    Args:
      parents: i32[B, K] the parent input of draft nodes 1..K; a parent outside `0 .. j-1` is
        read as the root (padding slots' parents are never checked by the host).

    Returns:
      (mask bool[B, T, T]: input i sees input j, i.e. j is i or one of its ancestors;
      depth i32[B, T]), T = K + 1.
    """
    b, k = parents.shape
    t = k + 1
    parents = _in_range(parents)
    # step[i, j]: j is i itself or its parent; its K-th boolean power is the closure, reached by
    # squaring (float32: the counts stay exact integers).
    full = jnp.concatenate([jnp.zeros((b, 1), jnp.int32), parents], axis=1)         # [B, T]
    mask = (jnp.eye(t, dtype=bool)[None]
            | (full[:, :, None] == jnp.arange(t)[None, None, :])).astype(jnp.float32)
    for _ in range(max(1, k.bit_length())):
        mask = jnp.minimum(jnp.einsum("bij,bjk->bik", mask, mask), 1.0)
    mask = mask > 0
    return mask, jnp.sum(mask, axis=2, dtype=jnp.int32) - 1


def accept(drafts: jax.Array, parents: jax.Array, draft_lens: jax.Array, target: jax.Array,
           mask: jax.Array, depth: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
    """The longest accepted path of each row's tree, plus the bonus token.

    Args:
      drafts: i32[B, K] draft nodes (only the first draft_lens[b] are real: a tree's nodes come
        parents first, so any prefix of them is a tree).
      parents: i32[B, K] as in `ancestors`.
      draft_lens: i32[B].
      target: i32[B, K+1] the target's token after each input.
      mask, depth: `ancestors(parents)`.

    Returns:
      new_tokens: i32[B, K+1] committed tokens, zero past num_new_tokens[b].
      num_new_tokens: i32[B] = accepted depth + 1.
      path: i32[B, K+1] the input at each depth of the accepted path (0 past it): the slots
        whose keys and values the committed tokens own.
    """
    b, k = drafts.shape
    t = k + 1
    real = jnp.arange(k, dtype=jnp.int32)[None, :] < draft_lens[:, None]
    parents = _in_range(parents)
    matches = real & (drafts == jnp.take_along_axis(target, parents, axis=1))
    matches = jnp.concatenate([jnp.ones((b, 1), bool), matches], axis=1)           # [B, T]
    accepted = ~jnp.any(mask & ~matches[:, None, :], axis=2)                       # [B, T]
    # The deepest accepted node; a tie (duplicate paths) goes to the earlier one.
    best = jnp.argmax(jnp.where(accepted, depth, -1), axis=1)
    num_accepted = jnp.take_along_axis(depth, best[:, None], axis=1)[:, 0]
    on_path = jnp.take_along_axis(mask, best[:, None, None], axis=1)[:, 0]        # [B, T]
    at_depth = on_path[:, None, :] & (depth[:, None, :] == jnp.arange(t)[None, :, None])
    path = jnp.argmax(at_depth, axis=2).astype(jnp.int32)                          # [B, T]
    num_new = num_accepted + 1
    keep = jnp.arange(t, dtype=jnp.int32)[None, :] < num_new[:, None]
    # The committed token at depth d is the target's after the path's node at depth d - 1.
    new_tokens = jnp.where(keep, jnp.take_along_axis(target, path, axis=1), 0)
    return new_tokens, num_new.astype(jnp.int32), jnp.where(keep, path, 0)
