"""Suffix automata as fixed-capacity arrays, one slot per request, and their XLA reference ops.

Vocabulary (the algorithm is documented in `jaxspec.host.sa_reference`):

* slot: one request's automaton. `SAState` holds `num_slots + 1` slots; the last one is the
  dummy slot, kept zeroed, that padding rows point at. It never extends and never matches.
* capacity: `max_seq_len` tokens of text, hence at most `2 * max_seq_len` states.
* state: `state_len`, `link` and `firstpos` at the state's index. State 0 is the root; its link
  and firstpos are unused and kept 0, so a zeroed slot is exactly the empty automaton.
* `num_states`: states in use, root included (a zeroed slot's 0 reads as 1).
* edges: transitions `(state, token) -> target` in an open-addressing hash table of
  `table_size(max_seq_len) = 4 * max_seq_len` buckets per slot, never dense vocabulary rows
  (vocabularies are 50k-260k). A bucket with `table_target == 0` is empty: no edge enters the
  root. Probing is linear (`next_bucket`) from `hash_bucket(state, token)`. An automaton of `n`
  tokens has at most `3n` edges, so the table is never more than 3/4 full. Edges are never
  deleted; redirecting an edge rewrites its target in place.
* edge lists: cloning a state copies its edges, so each state also heads a singly linked list of
  its buckets (`edge_head`, then `table_next`), stored as bucket index + 1 with 0 for "none".

The host builder (`jaxspec.host.sa_build`) inserts edges in the same order with the same hash, so a
prompt built on the host and a slot extended here token by token are bit-identical.

Bytes per slot, `n = max_seq_len`, `T = table_size(n) = 4n` (see `bytes_per_slot`):

    4 * (4 * 2n  +  n  +  4 * T  +  3)  =  100 n + 12
     states: state_len, link, firstpos, edge_head; text; table: state, token, target, next; scalars

so 3.1 MiB per slot at `n = 32768` and 25 MiB at `n = 262144`.

The ops here are the production CPU path and the reference of the Pallas kernels in
`jaxspec.pallas_kernels` (which computes bit-identical results). They are vectorised across the
batch: every row walks its own slot, all rows advance in lockstep through `lax.while_loop`s, and
rows that are done (or padding) write nowhere (`mode="drop"` scatters to an out-of-range slot).
All updates are scalar scatters into the loop carry, so XLA updates the state in place: a step
costs amortised O(1) per committed token and nothing proportional to `max_seq_len`.
"""

import functools

import flax.struct
import jax
from jax import lax
import jax.numpy as jnp
import numpy as np

from jaxspec.host import sa_reference

# Multiplicative mixing constants of `hash_bucket` (int32, wrapping arithmetic); the host builder
# repeats them, so they are part of the layout.
HASH_STATE_MUL = 0x01000193
HASH_MIX_MUL = 0x2C1B3C6D
MIN_TABLE_SIZE = 8  # a few buckets even for toy capacities
_POSITIVE = 0x7FFFFFFF
MAX_GLOBAL_SUFFIX_LEN = sa_reference.MAX_GLOBAL_SUFFIX_LEN


def max_states(max_seq_len: int) -> int:
    """States per slot: an automaton of n tokens has at most 2n - 1 states (n >= 2)."""
    return 2 * max_seq_len


def table_size(max_seq_len: int) -> int:
    """Hash buckets per slot: 4 * max_seq_len (load <= 3/4). Not rounded to a power of two,
    which would double the memory of capacities like `2048 + 1 + K`."""
    return max(MIN_TABLE_SIZE, 4 * max_seq_len)


def bytes_per_slot(max_seq_len: int) -> int:
    """Device bytes of one slot of an `SAState` with capacity `max_seq_len`."""
    words = 4 * max_states(max_seq_len) + max_seq_len + 4 * table_size(max_seq_len) + 3
    return 4 * words


def hash_bucket(state, token, num_buckets: int):
    """The first bucket probed for edge `(state, token)`; int32 arrays in, int32 out."""
    x = state * jnp.int32(HASH_STATE_MUL) + token
    x = x ^ lax.shift_right_logical(x, jnp.int32(15))
    x = x * jnp.int32(HASH_MIX_MUL)
    x = x ^ lax.shift_right_logical(x, jnp.int32(13))
    return lax.rem(x & jnp.int32(_POSITIVE), jnp.int32(num_buckets))


def next_bucket(bucket, num_buckets: int):
    """Linear probing, wrapping around the table."""
    return jnp.where(bucket + 1 == num_buckets, 0, bucket + 1)


@flax.struct.dataclass(kw_only=True)
class SAState:
    """Suffix automata of `S = num_slots + 1` slots (the last is the dummy); all int32.

    With `N = max_seq_len`, `T = table_size(N)`. The host builder returns the same fields for one
    slot, without the leading slot axis.

    Attributes:
      state_len: [S, 2N] length of each state's longest string.
      link: [S, 2N] suffix link (root: 0, unused).
      firstpos: [S, 2N] end index of the first occurrence (root: 0, unused).
      edge_head: [S, 2N] 1 + bucket of the state's newest edge, 0 if none.
      text: [S, N] the tokens; only the first `text_len` are valid.
      text_len: [S] tokens in the text.
      num_states: [S] states in use, root included; 0 in a zeroed slot reads as 1.
      last: [S] the state of the whole text.
      table_state: [S, T] edge source state.
      table_token: [S, T] edge token.
      table_target: [S, T] edge target state; 0 marks an empty bucket.
      table_next: [S, T] 1 + bucket of the source state's next older edge, 0 if none.
    """

    state_len: jax.Array
    link: jax.Array
    firstpos: jax.Array
    edge_head: jax.Array
    text: jax.Array
    text_len: jax.Array
    num_states: jax.Array
    last: jax.Array
    table_state: jax.Array
    table_token: jax.Array
    table_target: jax.Array
    table_next: jax.Array

    @property
    def max_seq_len(self) -> int:
        return self.text.shape[-1]

    @property
    def table_size(self) -> int:
        return self.table_target.shape[-1]

    @property
    def num_slots(self) -> int:
        """Usable slots; the dummy slot's index."""
        return self.text.shape[0] - 1

    def slot(self, index: int) -> "SAState":
        """One slot's arrays, without the slot axis (the host builder's layout)."""
        return jax.tree.map(lambda a: a[index], self)


def zeros(max_seq_len: int, leading: tuple[int, ...] = (), xp=jnp) -> SAState:
    """An all-zero `SAState` (zeroed slots are empty automata) with extra leading axes."""
    if max_seq_len < 1:
        raise ValueError(f"max_seq_len must be >= 1, got {max_seq_len}")
    states, buckets = leading + (max_states(max_seq_len),), leading + (table_size(max_seq_len),)
    return SAState(
        state_len=xp.zeros(states, xp.int32), link=xp.zeros(states, xp.int32),
        firstpos=xp.zeros(states, xp.int32), edge_head=xp.zeros(states, xp.int32),
        text=xp.zeros(leading + (max_seq_len,), xp.int32),
        text_len=xp.zeros(leading, xp.int32), num_states=xp.zeros(leading, xp.int32),
        last=xp.zeros(leading, xp.int32),
        table_state=xp.zeros(buckets, xp.int32), table_token=xp.zeros(buckets, xp.int32),
        table_target=xp.zeros(buckets, xp.int32), table_next=xp.zeros(buckets, xp.int32))


def init_state(num_slots: int, max_seq_len: int) -> SAState:
    """`num_slots` empty slots plus the zeroed dummy slot, on the default device."""
    if num_slots < 1:
        raise ValueError(f"num_slots must be >= 1, got {num_slots}")
    return zeros(max_seq_len, (num_slots + 1,))


@functools.partial(jax.jit, donate_argnums=0)
def write_slot(state: SAState, slot, slot_state: SAState) -> SAState:
    """Overwrites slot `slot` (int32 scalar) with one slot's arrays; the state is donated."""
    return jax.tree.map(lambda a, x: a.at[slot].set(x), state, slot_state)


# --------------------------------------------------------------------------------------------
# Gathers and masked scatters over [S, ...] arrays, one element per batch row.


def _get(a, slots, index):
    return a.at[slots, index].get(mode="clip")


def _set(a, slots, index, value, mask):
    # Masked-off rows write to slot S (out of range), which "drop" discards.
    return a.at[jnp.where(mask, slots, a.shape[0]), index].set(value, mode="drop")


def _set_scalar(a, slots, value, mask):
    return a.at[jnp.where(mask, slots, a.shape[0])].set(value, mode="drop")


def _parent(state: SAState, slots, s):
    """Suffix link, with -1 above the root."""
    return jnp.where(s == 0, -1, _get(state.link, slots, s))


def _probe(state: SAState, slots, source, token, mask):
    """Per row: the bucket of edge `(source, token)` or the empty bucket it would go to.

    Returns `(bucket, found)`; rows outside `mask` get an unspecified bucket and `found` False.
    """
    def collides(bucket):
        other = ((_get(state.table_state, slots, bucket) != source)
                 | (_get(state.table_token, slots, bucket) != token))
        return mask & (_get(state.table_target, slots, bucket) != 0) & other

    def body(carry):
        bucket, again = carry
        bucket = jnp.where(again, next_bucket(bucket, state.table_size), bucket)
        return bucket, collides(bucket)

    first = hash_bucket(source, token, state.table_size)
    bucket, _ = lax.while_loop(lambda c: jnp.any(c[1]), body, (first, collides(first)))
    return bucket, mask & (_get(state.table_target, slots, bucket) != 0)


def _insert(state: SAState, slots, bucket, source, token, target, mask) -> SAState:
    """Writes edge `source --token--> target` into an empty `bucket` and links it to `source`."""
    older = _get(state.edge_head, slots, source)
    return state.replace(
        table_state=_set(state.table_state, slots, bucket, source, mask),
        table_token=_set(state.table_token, slots, bucket, token, mask),
        table_target=_set(state.table_target, slots, bucket, target, mask),
        table_next=_set(state.table_next, slots, bucket, older, mask),
        # Writing through `older` orders the read before the write, which lets XLA update
        # edge_head in place instead of copying it.
        edge_head=_set(state.edge_head, slots, source, jnp.where(mask, bucket + 1, older), mask))


def _extend_token(state: SAState, slots, token, active) -> SAState:
    """One online-construction step per active row (`sa_reference.SuffixAutomaton.extend`)."""
    n = state.text_len[slots]
    cur = jnp.maximum(state.num_states[slots], 1)
    last = state.last[slots]
    state = state.replace(
        text=_set(state.text, slots, n, token, active),
        state_len=_set(state.state_len, slots, cur, _get(state.state_len, slots, last) + 1,
                       active),
        firstpos=_set(state.firstpos, slots, cur, n, active))

    # 1. Add `p --token--> cur` up the suffix links until some p already has a `token` edge.
    def add_edges(carry):
        state, p, bucket, walking = carry
        probed, found = _probe(state, slots, p, token, walking)
        missing = walking & ~found
        state = _insert(state, slots, probed, p, token, cur, missing)
        bucket = jnp.where(walking & found, probed, bucket)
        p = jnp.where(missing, _parent(state, slots, p), p)
        return state, p, bucket, missing & (p >= 0)

    state, p, bucket, _ = lax.while_loop(lambda c: jnp.any(c[3]), add_edges,
                                         (state, last, jnp.zeros_like(last), active))
    has_q = active & (p >= 0)
    q = jnp.where(has_q, _get(state.table_target, slots, bucket), 0)
    len_p1 = _get(state.state_len, slots, p) + 1
    solid = has_q & (len_p1 == _get(state.state_len, slots, q))
    cloning = has_q & ~solid
    clone = cur + 1

    # 2. Clone q: same link and first occurrence, shorter length, a copy of q's edges. The links
    # are final now: the walks below only visit states shorter than q, never q or cur.
    link = _set(state.link, slots, clone, _get(state.link, slots, q), cloning)
    link = _set(link, slots, q, clone, cloning)
    link = _set(link, slots, cur, jnp.where(cloning, clone, jnp.where(solid, q, 0)), active)
    state = state.replace(
        state_len=_set(state.state_len, slots, clone, len_p1, cloning),
        firstpos=_set(state.firstpos, slots, clone, _get(state.firstpos, slots, q), cloning),
        link=link)

    def copy_edge(carry):
        state, edge = carry
        copying = edge != 0
        entry = edge - 1
        edge_token = _get(state.table_token, slots, entry)
        probed, _ = _probe(state, slots, clone, edge_token, copying)
        state = _insert(state, slots, probed, clone, edge_token,
                        _get(state.table_target, slots, entry), copying)
        return state, jnp.where(copying, _get(state.table_next, slots, entry), 0)

    state, _ = lax.while_loop(lambda c: jnp.any(c[1] != 0), copy_edge,
                              (state, jnp.where(cloning, _get(state.edge_head, slots, q), 0)))

    # 3. Redirect `p --token--> q` to the clone up the suffix links.
    def redirect(carry):
        state, p, walking = carry
        probed, _ = _probe(state, slots, p, token, walking)
        hit = walking & (_get(state.table_target, slots, probed) == q)
        state = state.replace(table_target=_set(state.table_target, slots, probed, clone, hit))
        p = jnp.where(hit, _parent(state, slots, p), p)
        return state, p, hit & (p >= 0)

    state, _, _ = lax.while_loop(lambda c: jnp.any(c[2]), redirect, (state, p, cloning))
    return state.replace(
        last=_set_scalar(state.last, slots, cur, active),
        num_states=_set_scalar(state.num_states, slots, clone + cloning.astype(jnp.int32),
                               active),
        text_len=_set_scalar(state.text_len, slots, n + 1, active))


def validate_batch(slots, accepted, num_accepted, draft_len: int,
                   max_ngram_size: int) -> None:
    """Trace-time checks of shapes, dtypes and static arguments shared by every implementation."""
    if slots.ndim != 1 or accepted.ndim != 2 or num_accepted.shape != slots.shape:
        raise ValueError(f"want slots [B], accepted [B, K+1], num_accepted [B]; got "
                         f"{slots.shape}, {accepted.shape}, {num_accepted.shape}")
    if accepted.shape[0] != slots.shape[0] or accepted.shape[1] < 1:
        raise ValueError(f"accepted must be [B={slots.shape[0]}, >=1], got {accepted.shape}")
    for name, x in (("slots", slots), ("accepted", accepted), ("num_accepted", num_accepted)):
        if x.dtype != jnp.int32:
            raise TypeError(f"{name} must be int32, got {x.dtype}")
    if draft_len < 0:
        raise ValueError(f"draft_len must be >= 0, got {draft_len}")
    if max_ngram_size != -1 and max_ngram_size < 1:
        raise ValueError(f"max_ngram_size must be -1 (longest match) or >= 1, got {max_ngram_size}")


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
        probed, _ = _probe(state, slots, s, _get(state.text, slots, n - length + i), reading)
        return jnp.where(reading, _get(state.table_target, slots, probed), s)

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
    longest_state = _get(state.link, slots, state.last[slots])
    longest = _get(state.state_len, slots, longest_state)
    if max_ngram_size == -1:
        match_len, matched = longest, longest_state
    else:
        match_len = jnp.minimum(longest, max_ngram_size)
        matched = _read_suffix_state(state, slots, match_len, max_ngram_size)
    start = _get(state.firstpos, slots, matched) + 1
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
