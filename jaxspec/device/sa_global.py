"""Global pool search: draft from whichever active slot best continues a row's recent text.

Semantics (`jaxspec.host.sa_reference.global_draft`, TensorRT-LLM's `GlobalSearchKernel`): the
query is the last `min(64 or M, text_len)` tokens of the row's own slot; every slot in
`active_mask` reports the longest suffix of the query that occurs in its text with at least one
token after it (leftmost occurrence); the winner is ranked by

    longer match > own slot > longer continuation (text_len - start) > lower slot index.

The XLA reference runs one lane per (row, slot) pair, all lanes in lockstep: each loop iteration
probes one hash bucket per lane of a matching-statistics walk, so a step costs about
`64 + fallbacks` iterations over `B * (num_slots + 1)` lanes, independent of the history length.
"""

import functools

import jax
from jax import lax
import jax.numpy as jnp

from jaxspec import sa_layout
from jaxspec.device import sa_state


def global_search(state: sa_layout.SAState, slots, active_mask, *, draft_len: int,
                  max_ngram_size: int = -1):
    """Each row's draft from the best active slot, without extending (see
    `extend_and_global_search`)."""
    num_rows, width = slots.shape[0], state.num_slots + 1
    cap = sa_layout.suffix_cap(max_ngram_size)
    own_len = state.text_len[slots]
    query_len = jnp.minimum(own_len, cap)
    offsets = jnp.arange(cap, dtype=jnp.int32)[None, :]
    query = state.text.at[slots[:, None], (own_len - query_len)[:, None] + offsets].get(
        mode="clip")  # [B, cap]

    # One lane per (row, slot), flattened row-major.
    row = jnp.repeat(jnp.arange(num_rows, dtype=jnp.int32), width)
    lane_slot = jnp.tile(jnp.arange(width, dtype=jnp.int32), num_rows)
    lane_len = query_len[row]
    searched = active_mask[lane_slot] & (lane_len > 0)

    def token_at(i):
        return query[row, jnp.minimum(i, cap - 1)]

    def get(a, *index):
        return a.at[(lane_slot, *index)].get(mode="clip")

    # Matching statistics: after reading query[:i], `s` is the state of the longest suffix of it
    # that occurs in the lane's slot, `matched` its length. Each iteration probes one bucket.
    def walk(carry):
        s, matched, i, bucket, live = carry
        token = token_at(i)
        edge = get(state.edges, bucket)  # [P, 4]
        target = edge[:, sa_layout.TARGET]
        key = (edge[:, sa_layout.SOURCE] == s) & (edge[:, sa_layout.TOKEN] == token)
        hit = live & (target != 0) & key
        miss = live & (target == 0)
        drop = miss & (s != 0)  # retry `token` from the suffix link
        advance = hit | (miss & (s == 0))
        s = jnp.where(hit, target, jnp.where(drop, get(state.states, s, sa_layout.LINK), s))
        matched = jnp.where(hit, matched + 1,
                            jnp.where(drop, get(state.states, s, sa_layout.LEN),
                                      jnp.where(miss, 0, matched)))
        i = i + advance.astype(jnp.int32)
        bucket = jnp.where(advance | drop, sa_layout.hash_bucket(s, token_at(i), state.table_size),
                           jnp.where(live, sa_layout.next_bucket(bucket, state.table_size),
                                     bucket))
        return s, matched, i, bucket, live & (i < lane_len)

    zero = jnp.zeros_like(row)
    start = (zero, zero, zero, sa_layout.hash_bucket(zero, token_at(zero), state.table_size),
             searched)
    s, matched, _, _, _ = lax.while_loop(lambda c: jnp.any(c[4]), walk, start)

    # A match that only occurs at the very end has no continuation: fall back along the links.
    lane_text_len = state.text_len[lane_slot]

    def stuck(s):
        return (s != 0) & (get(state.states, s, sa_layout.FIRSTPOS) + 1 >= lane_text_len)

    def fall_back(carry):
        s, matched = carry
        back = stuck(s)
        s = jnp.where(back, get(state.states, s, sa_layout.LINK), s)
        return s, jnp.where(back, get(state.states, s, sa_layout.LEN), matched)

    s, matched = lax.while_loop(lambda c: jnp.any(stuck(c[0])), fall_back, (s, matched))

    found = searched & (s != 0)
    begin = get(state.states, s, sa_layout.FIRSTPOS) + 1
    matched = jnp.where(found, matched, 0).reshape(num_rows, width)
    begin = begin.reshape(num_rows, width)
    continuation = jnp.where(found, lane_text_len - begin.reshape(-1), -1).reshape(num_rows,
                                                                                  width)
    best_len = matched.max(axis=1)
    ties = (matched == best_len[:, None]) & (best_len[:, None] > 0)
    own_ties = jnp.take_along_axis(ties, slots[:, None], axis=1)[:, 0]
    longest_cont = jnp.where(ties, continuation, -1).max(axis=1)
    # argmax returns the first maximum, so full ties go to the lower slot index.
    other = jnp.argmax(ties & (continuation == longest_cont[:, None]), axis=1).astype(jnp.int32)
    winner = jnp.where(own_ties, slots, other)
    win_start = jnp.take_along_axis(begin, winner[:, None], axis=1)[:, 0]
    draft_tokens, draft_lens = sa_state.draft_from(state, winner, best_len, win_start, draft_len)
    return best_len, draft_tokens, draft_lens


@functools.partial(jax.jit, static_argnames=("draft_len", "max_ngram_size"), donate_argnums=0)
def extend_and_global_search(state: sa_layout.SAState, slots, accepted, num_accepted, active_mask,
                             *, draft_len: int, max_ngram_size: int = -1):
    """Extends each row's slot with its committed tokens, then searches all active slots.

    Args:
      state: `SAState`, donated (updated in place).
      slots: i32[B] each row's slot; padding rows use the dummy slot `state.num_slots`.
      accepted: i32[B, W] committed tokens; only the first `num_accepted[b]` are valid.
      num_accepted: i32[B] in [0, W].
      active_mask: bool[num_slots + 1] the slots searched (the global pool).
      draft_len: K, the static draft width.
      max_ngram_size: -1 caps the query suffix at 64 tokens, M in [1, 64] caps it at M.

    Returns:
      `(state, match_len i32[B], draft_tokens i32[B, K], draft_lens i32[B])`; only the first
      `draft_lens[b]` entries of `draft_tokens[b]` are valid, the rest are 0.

    Raises:
      ValueError, TypeError: on bad shapes, dtypes or static arguments (at trace time).
    """
    sa_layout.validate_batch(slots, accepted, num_accepted, draft_len, max_ngram_size)
    sa_layout.validate_mask(state, active_mask, max_ngram_size)
    state = sa_state.extend(state, slots, accepted, num_accepted)
    return (state, *global_search(state, slots, active_mask, draft_len=draft_len,
                                  max_ngram_size=max_ngram_size))
