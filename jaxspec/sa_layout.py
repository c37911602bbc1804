"""The suffix automaton's array layout: the contract between the host builder, the XLA ops and the
Pallas kernels. A leaf module: it imports nothing from jaxspec, so every layer may depend on it.

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

Bytes per slot, `n = max_seq_len`, `T = table_size(n) = 4n` (see `bytes_per_slot`):

    4 * (2n * 4  +  n  +  T * 4  +  3)  =  100 n + 12
         states    text   edges    text_len, num_states, last

so 3.1 MiB per slot at `n = 32768` and 25 MiB at `n = 262144`.

Lookup modes, shared by every implementation: `max_ngram_size = -1` drafts after the longest
earlier-occurring suffix, `M >= 1` tries suffixes of M..1 tokens; the global search matches at
most `suffix_cap(max_ngram_size)` tokens of the row's own text against every active slot.
"""

import flax.struct
import jax
from jax import lax
import jax.numpy as jnp

# Columns of `SAState.states` and `SAState.edges`.
LEN, LINK, FIRSTPOS, EDGE_HEAD = range(4)
SOURCE, TOKEN, TARGET, NEXT = range(4)
# Multiplicative mixing constants of `hash_bucket` (int32, wrapping arithmetic); the host builder
# repeats them, so they are part of the layout.
HASH_STATE_MUL = 0x01000193
HASH_MIX_MUL = 0x2C1B3C6D
HASH_POSITIVE = 0x7FFFFFFF
MIN_TABLE_SIZE = 8  # a few buckets even for toy capacities
MAX_GLOBAL_SUFFIX_LEN = 64  # TensorRT-LLM's kMaxGlobalSuffixLen; longer query suffixes are cut.


def suffix_cap(max_ngram_size: int) -> int:
    """Longest suffix of a row's own text that the global search matches against other slots."""
    return MAX_GLOBAL_SUFFIX_LEN if max_ngram_size == -1 else max_ngram_size


def check_ngram_size(max_ngram_size: int) -> None:
    """Raises ValueError unless `max_ngram_size` is -1 (longest match) or >= 1."""
    if max_ngram_size != -1 and max_ngram_size < 1:
        raise ValueError(f"max_ngram_size must be -1 (longest match) or >= 1, got {max_ngram_size}")


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
    return lax.rem(x & jnp.int32(HASH_POSITIVE), jnp.int32(num_buckets))


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
    check_ngram_size(max_ngram_size)


def validate_mask(state: SAState, active_mask, max_ngram_size: int) -> None:
    """Trace-time checks specific to the global search."""
    if active_mask.shape != (state.num_slots + 1,) or active_mask.dtype != jnp.bool_:
        raise ValueError(f"active_mask must be bool[{state.num_slots + 1}], got "
                         f"{active_mask.dtype}{list(active_mask.shape)}")
    if max_ngram_size > MAX_GLOBAL_SUFFIX_LEN:
        raise ValueError(f"global search takes max_ngram_size <= {MAX_GLOBAL_SUFFIX_LEN}, got "
                         f"{max_ngram_size}")
