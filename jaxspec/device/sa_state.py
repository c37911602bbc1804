"""Suffix automata as fixed-capacity arrays, one slot per request, and their XLA reference ops.

Vocabulary (the algorithm is documented in `jaxspec.host.sa_reference`):

* slot: one request's automaton. `SAState` holds `num_slots + 1` slots; the last one is the
  dummy slot, kept zeroed, that padding rows point at. It never extends and never matches.
* capacity: `max_seq_len` tokens of text, hence at most `2 * max_seq_len` states.
* state: one row of `states` holding `LEN` (its longest string's length), `LINK` (suffix link),
  `FIRSTPOS` (end index of its first occurrence) and `EDGE_HEAD` (below). State 0 is the root; its
  link and firstpos are unused and kept 0, so a zeroed slot is exactly the empty automaton.
* `num_states`: states in use, root included (a zeroed slot's 0 reads as 1).
* edges: transitions `(state, token) -> target` in an open-addressing hash table of
  `table_size(max_seq_len) = 4 * max_seq_len` buckets per slot, never dense vocabulary rows
  (vocabularies are 50k-260k). A bucket is one row of `edges`: `SOURCE`, `TOKEN`, `TARGET`, `NEXT`,
  so a probe reads 16 contiguous bytes. A bucket with `TARGET == 0` is empty: no edge enters the
  root. Probing is linear (`next_bucket`) from `hash_bucket(state, token)`. An automaton of `n`
  tokens has at most `3n` edges, so the table is never more than 3/4 full. Edges are never
  deleted; redirecting an edge rewrites its target in place.
* edge lists: cloning a state copies its edges, so each state heads a singly linked list of its
  buckets (`EDGE_HEAD`, then each bucket's `NEXT`), stored as bucket index + 1 with 0 for "none".

The host builder (`jaxspec.host.sa_build`) inserts edges in the same order with the same hash, so a
prompt built on the host and a slot extended here token by token are bit-identical.

Bytes per slot, `n = max_seq_len`, `T = table_size(n) = 4n` (see `bytes_per_slot`):

    4 * (2n * 4  +  n  +  T * 4  +  3)  =  100 n + 12
         states    text   edges    text_len, num_states, last

so 3.1 MiB per slot at `n = 32768` and 25 MiB at `n = 262144`.

The ops here are the production CPU path and the reference of the Pallas kernels in
`jaxspec.pallas_kernels` (which computes bit-identical results). They are vectorised across the
batch: every row walks its own slot, all rows advance in lockstep through `lax.while_loop`s, and
rows that are done (or padding) write nowhere (`mode="drop"` scatters to an out-of-range slot).
All updates are row or scalar scatters into the loop carry, so XLA updates the state in place: a
step costs amortised O(1) per committed token and nothing proportional to `max_seq_len`.
"""

import functools

import flax.struct
import jax
from jax import lax
import jax.numpy as jnp

from jaxspec.host import sa_reference

# Columns of `SAState.states` and `SAState.edges`.
LEN, LINK, FIRSTPOS, EDGE_HEAD = range(4)
SOURCE, TOKEN, TARGET, NEXT = range(4)
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
      states: [S, 2N, 4] per state: LEN, LINK, FIRSTPOS, EDGE_HEAD (1 + bucket of its newest
        edge, 0 if none).
      text: [S, N] the tokens; only the first `text_len` are valid.
      text_len: [S] tokens in the text.
      num_states: [S] states in use, root included; 0 in a zeroed slot reads as 1.
      last: [S] the state of the whole text.
      edges: [S, T, 4] per bucket: SOURCE, TOKEN, TARGET (0: empty bucket), NEXT (1 + bucket of
        the source's next older edge, 0 if none).
    """

    states: jax.Array
    text: jax.Array
    text_len: jax.Array
    num_states: jax.Array
    last: jax.Array
    edges: jax.Array

    @property
    def max_seq_len(self) -> int:
        return self.text.shape[-1]

    @property
    def table_size(self) -> int:
        return self.edges.shape[-2]

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
    return SAState(
        states=xp.zeros(leading + (max_states(max_seq_len), 4), xp.int32),
        text=xp.zeros(leading + (max_seq_len,), xp.int32),
        text_len=xp.zeros(leading, xp.int32), num_states=xp.zeros(leading, xp.int32),
        last=xp.zeros(leading, xp.int32),
        edges=xp.zeros(leading + (table_size(max_seq_len), 4), xp.int32))


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
