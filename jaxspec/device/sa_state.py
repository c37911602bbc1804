"""The suffix automaton's XLA ops: the production CPU path and the reference of the Pallas kernels.

The layout (`SAState`, columns, hash) is `jaxspec.sa_layout`; the algorithm is documented in
`jaxspec.host.sa_reference`. The ops are vectorised across the batch: every row walks its own slot,
all rows advance in lockstep through `lax.while_loop`s, and rows that are done (or padding) write
nowhere (`mode="drop"` scatters to an out-of-range slot). All updates are row or scalar scatters
into the loop carry, so XLA updates the state in place: a step costs amortised O(1) per committed
token and nothing proportional to `max_seq_len`. `jaxspec.pallas_kernels` computes bit-identical
results; `jaxspec.device.ops` picks one.
"""

import functools

import jax
from jax import lax
import jax.numpy as jnp

from jaxspec.sa_layout import EDGE_HEAD
from jaxspec.sa_layout import FIRSTPOS
from jaxspec.sa_layout import LEN
from jaxspec.sa_layout import LINK
from jaxspec.sa_layout import NEXT
from jaxspec.sa_layout import SOURCE
from jaxspec.sa_layout import TARGET
from jaxspec.sa_layout import TOKEN
from jaxspec.sa_layout import SAState
from jaxspec.sa_layout import hash_bucket
from jaxspec.sa_layout import next_bucket
from jaxspec.sa_layout import validate_batch


@functools.partial(jax.jit, donate_argnums=0)
def write_slot(state: SAState, slot, slot_state: SAState) -> SAState:
    """Overwrites slot `slot` (int32 scalar) with one slot's arrays; the state is donated."""
    return jax.tree.map(lambda a, x: a.at[slot].set(x), state, slot_state)


# --------------------------------------------------------------------------------------------
# Gathers and masked scatters over [S, ...] arrays, one element or row per batch row.


def _get(a, slots, *index):
    return a.at[(slots, *index)].get(mode="clip")


def _set(a, slots, *index_and_value, mask):
    # Masked-off rows write to slot S (out of range), which "drop" discards.
    *index, value = index_and_value
    return a.at[(jnp.where(mask, slots, a.shape[0]), *index)].set(value, mode="drop")


def _parent(state: SAState, slots, s):
    """Suffix link, with -1 above the root."""
    return jnp.where(s == 0, -1, _get(state.states, slots, s, LINK))


def _probe(state: SAState, slots, source, token, mask):
    """Per row: the bucket of edge `(source, token)` or the empty bucket it would go to.

    Returns `(bucket, edge i32[B, 4], found)`: the bucket's row and whether it holds the edge;
    rows outside `mask` get an unspecified bucket and `found` False.
    """
    def collides(edge):
        other = (edge[:, SOURCE] != source) | (edge[:, TOKEN] != token)
        return mask & (edge[:, TARGET] != 0) & other

    def body(carry):
        bucket, _, again = carry
        bucket = jnp.where(again, next_bucket(bucket, state.table_size), bucket)
        edge = _get(state.edges, slots, bucket)
        return bucket, edge, collides(edge)

    first = hash_bucket(source, token, state.table_size)
    edge = _get(state.edges, slots, first)
    bucket, edge, _ = lax.while_loop(lambda c: jnp.any(c[2]), body, (first, edge, collides(edge)))
    return bucket, edge, mask & (edge[:, TARGET] != 0)


def _insert(state: SAState, slots, bucket, source, token, target, mask) -> SAState:
    """Writes edge `source --token--> target` into an empty `bucket` and links it to `source`."""
    older = _get(state.states, slots, source, EDGE_HEAD)
    edge = jnp.stack([source, token, target, older], axis=-1)
    return state.replace(
        edges=_set(state.edges, slots, bucket, edge, mask=mask),
        # Writing through `older` orders the read before the write, which lets XLA update
        # `states` in place instead of copying it.
        states=_set(state.states, slots, source, EDGE_HEAD, jnp.where(mask, bucket + 1, older),
                    mask=mask))


def _extend_token(state: SAState, slots, token, active) -> SAState:
    """One online-construction step per active row (`sa_reference.SuffixAutomaton.extend`)."""
    n = state.text_len[slots]
    cur = jnp.maximum(state.num_states[slots], 1)
    last = state.last[slots]
    zero = jnp.zeros_like(n)
    new = jnp.stack([_get(state.states, slots, last, LEN) + 1, zero, n, zero], axis=-1)
    state = state.replace(text=_set(state.text, slots, n, token, mask=active),
                          states=_set(state.states, slots, cur, new, mask=active))

    # 1. Add `p --token--> cur` up the suffix links until some p already has a `token` edge.
    def add_edges(carry):
        state, p, q, walking = carry
        bucket, edge, found = _probe(state, slots, p, token, walking)
        missing = walking & ~found
        state = _insert(state, slots, bucket, p, token, cur, missing)
        q = jnp.where(walking & found, edge[:, TARGET], q)
        p = jnp.where(missing, _parent(state, slots, p), p)
        return state, p, q, missing & (p >= 0)

    state, p, q, _ = lax.while_loop(lambda c: jnp.any(c[3]), add_edges,
                                    (state, last, zero, active))
    has_q = active & (p >= 0)
    q = jnp.where(has_q, q, 0)
    q_row = _get(state.states, slots, q)
    len_p1 = _get(state.states, slots, p, LEN) + 1
    solid = has_q & (len_p1 == q_row[:, LEN])
    cloning = has_q & ~solid
    clone = cur + 1

    # 2. Clone q: same link and first occurrence, shorter length, a copy of q's edges. The links
    # are final now: the walks below only visit states shorter than q, never q or cur.
    clone_row = jnp.stack([len_p1, q_row[:, LINK], q_row[:, FIRSTPOS], zero], axis=-1)
    states = _set(state.states, slots, clone, clone_row, mask=cloning)
    states = _set(states, slots, q, LINK, clone, mask=cloning)
    states = _set(states, slots, cur, LINK, jnp.where(cloning, clone, jnp.where(solid, q, 0)),
                  mask=active)
    state = state.replace(states=states)

    def copy_edge(carry):
        state, edge_ref = carry
        copying = edge_ref != 0
        edge = _get(state.edges, slots, edge_ref - 1)
        bucket, _, _ = _probe(state, slots, clone, edge[:, TOKEN], copying)
        state = _insert(state, slots, bucket, clone, edge[:, TOKEN], edge[:, TARGET], copying)
        return state, jnp.where(copying, edge[:, NEXT], 0)

    state, _ = lax.while_loop(lambda c: jnp.any(c[1] != 0), copy_edge,
                              (state, jnp.where(cloning, q_row[:, EDGE_HEAD], 0)))

    # 3. Redirect `p --token--> q` to the clone up the suffix links.
    def redirect(carry):
        state, p, walking = carry
        bucket, edge, _ = _probe(state, slots, p, token, walking)
        hit = walking & (edge[:, TARGET] == q)
        state = state.replace(edges=_set(state.edges, slots, bucket, TARGET, clone, mask=hit))
        p = jnp.where(hit, _parent(state, slots, p), p)
        return state, p, hit & (p >= 0)

    state, _, _ = lax.while_loop(lambda c: jnp.any(c[2]), redirect, (state, p, cloning))
    return state.replace(
        last=_set(state.last, slots, cur, mask=active),
        num_states=_set(state.num_states, slots, clone + cloning.astype(jnp.int32), mask=active),
        text_len=_set(state.text_len, slots, n + 1, mask=active))


def extend(state: SAState, slots, accepted, num_accepted) -> SAState:
    """Appends `accepted[b, :num_accepted[b]]` to slot `slots[b]`, for every row b.

    Rows on the dummy slot extend nothing. A slot at capacity (`max_seq_len` tokens) drops further
    tokens; `SAManager` refuses such sequences on the host before they get here.

    Args:
      state: the automata; donate it for an in-place update.
      slots: i32[B] distinct slots, except that any number of rows may use the dummy slot.
      accepted: i32[B, W] committed tokens (accepted drafts + bonus); only the first
        `num_accepted[b]` of row b are valid.
      num_accepted: i32[B] in [0, W].

    Returns:
      The extended state.
    """
    if slots.shape[0] == 1:
        # XLA turns one-row scatters into whole-array selects, which copy the slot arrays; a
        # second (dummy) row keeps them scatters that update in place.
        slots = jnp.append(slots, jnp.int32(state.num_slots))
        accepted = jnp.pad(accepted, ((0, 1), (0, 0)))
        num_accepted = jnp.append(num_accepted, jnp.int32(0))
    real = slots != state.num_slots

    def step(i, state):
        active = real & (i < num_accepted) & (state.text_len[slots] < state.max_seq_len)
        return _extend_token(state, slots, accepted[:, i], active)

    return lax.fori_loop(0, accepted.shape[1], step, state)


def _read_suffix_state(state: SAState, slots, length, max_length: int):
    """The state of the last `length[b]` tokens (which occur), read from the root."""
    n = state.text_len[slots]

    def step(i, s):
        reading = i < length
        _, edge, _ = _probe(state, slots, s, _get(state.text, slots, n - length + i), reading)
        return jnp.where(reading, edge[:, TARGET], s)

    return lax.fori_loop(0, max_length, step, jnp.zeros_like(slots))


def draft_from(state: SAState, slots, match_len, start, draft_len: int):
    """Drafts `text[slot, start:]` cut to `draft_len`, zero-filled; `(draft_tokens, draft_lens)`."""
    lens = jnp.where(match_len > 0, jnp.minimum(draft_len, state.text_len[slots] - start), 0)
    offsets = jnp.arange(draft_len, dtype=jnp.int32)[None, :]
    tokens = _get(state.text, slots[:, None], start[:, None] + offsets)
    return jnp.where(offsets < lens[:, None], tokens, 0), lens


def lookup(state: SAState, slots, *, draft_len: int, max_ngram_size: int = -1):
    """The next draft of each row from its own slot (`SuffixAutomaton.draft`).

    Longest mode (-1): the longest suffix that occurs earlier is the suffix link of `last`.
    Fixed mode (M): the first hit of sizes M..1 is `L = min(M, that length)`, continued after the
    first occurrence of the length-L suffix, whose state is found by reading it from the root
    (O(M), where walking down the links could take O(history) on runs like "aaaa...").

    Returns:
      `(match_len i32[B], draft_tokens i32[B, draft_len], draft_lens i32[B])`; only the first
      `draft_lens[b]` tokens of row b are real, the rest and rows without a match are 0.
    """
    longest_state = _get(state.states, slots, state.last[slots], LINK)
    longest = _get(state.states, slots, longest_state, LEN)
    if max_ngram_size == -1:
        match_len, matched = longest, longest_state
    else:
        match_len = jnp.minimum(longest, max_ngram_size)
        matched = _read_suffix_state(state, slots, match_len, max_ngram_size)
    start = _get(state.states, slots, matched, FIRSTPOS) + 1
    draft_tokens, draft_lens = draft_from(state, slots, match_len, start, draft_len)
    return match_len, draft_tokens, draft_lens


@functools.partial(jax.jit, static_argnames=("draft_len", "max_ngram_size"), donate_argnums=0)
def extend_and_lookup(state: SAState, slots, accepted, num_accepted, *, draft_len: int,
                      max_ngram_size: int = -1):
    """Extends each row's slot with its committed tokens, then drafts from it.

    Args:
      state: `SAState`, donated (updated in place).
      slots: i32[B] each row's slot; padding rows use the dummy slot `state.num_slots`.
      accepted: i32[B, W] committed tokens; only the first `num_accepted[b]` are valid.
      num_accepted: i32[B] in [0, W].
      draft_len: K, the static draft width.
      max_ngram_size: -1 for the longest match, M >= 1 for fixed sizes M..1.

    Returns:
      `(state, match_len i32[B], draft_tokens i32[B, K], draft_lens i32[B])`; only the first
      `draft_lens[b]` entries of `draft_tokens[b]` are valid, the rest are 0.

    Raises:
      ValueError, TypeError: on bad shapes, dtypes or static arguments (at trace time).
    """
    validate_batch(slots, accepted, num_accepted, draft_len, max_ngram_size)
    state = extend(state, slots, accepted, num_accepted)
    return (state, *lookup(state, slots, draft_len=draft_len, max_ngram_size=max_ngram_size))
