"""Pallas Triton kernel: extend each row's suffix automaton, then look up its next draft.

Reference (bit-identical results, and the CPU path): `jaxspec.device.sa_state.extend_and_lookup`;
the layout is `jaxspec.sa_layout`; the algorithm is documented in `jaxspec.host.sa_reference`.

One program per batch row, as TensorRT-LLM's one-thread-per-request kernels: the row's slot is
walked with scalar loads and stores over whole-array refs (no BlockSpecs), data-dependent
`lax.while_loop`s, and the automaton arrays are updated in place through `input_output_aliases`.
Rows own distinct slots (padding rows all use the dummy slot and write nothing), so programs never
race.
"""

import functools

import jax
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu
import jax.numpy as jnp

from jaxspec import sa_layout
from jaxspec.sa_layout import EDGE_HEAD
from jaxspec.sa_layout import FIRSTPOS
from jaxspec.sa_layout import LEN
from jaxspec.sa_layout import LINK
from jaxspec.sa_layout import NEXT
from jaxspec.sa_layout import SOURCE
from jaxspec.sa_layout import TARGET
from jaxspec.sa_layout import TOKEN

# Scalar code: one warp is plenty, more only replicate the same loads.
NUM_WARPS = 1
NUM_STAGES = 1
_INT32_ELEMENTS = 2**31  # Triton computes element offsets in int32.

# Field order of the state refs in the kernels, after the row inputs.
STATE_FIELDS = tuple(sa_layout.SAState.__dataclass_fields__)


class SlotRefs:
    """Scalar access to one slot of the state refs inside a kernel: `sa["states", s, LEN]`,
    `sa["text", i]`, `sa["last"]`."""

    def __init__(self, refs, slot, table_size: int):
        self.refs = dict(zip(STATE_FIELDS, refs, strict=True))
        self.slot = slot
        self.table_size = table_size

    def _ref_and_index(self, key):
        name, *index = (key,) if isinstance(key, str) else key
        return self.refs[name], (self.slot, *index)

    def __getitem__(self, key):
        ref, index = self._ref_and_index(key)
        return ref[index]

    def __setitem__(self, key, value):
        ref, index = self._ref_and_index(key)
        ref[index] = value

    def parent(self, s):
        return jnp.where(s == 0, -1, self["states", jnp.maximum(s, 0), LINK])

    def probe(self, source, token):
        """The bucket of edge `(source, token)`, or the empty bucket where it would go."""
        def collides(bucket):
            return ((self["edges", bucket, TARGET] != 0)
                    & ((self["edges", bucket, SOURCE] != source)
                       | (self["edges", bucket, TOKEN] != token)))

        return lax.while_loop(collides,
                              lambda bucket: sa_layout.next_bucket(bucket, self.table_size),
                              sa_layout.hash_bucket(source, token, self.table_size))

    def insert(self, bucket, source, token, target):
        self["edges", bucket, SOURCE] = source
        self["edges", bucket, TOKEN] = token
        self["edges", bucket, TARGET] = target
        self["edges", bucket, NEXT] = self["states", source, EDGE_HEAD]
        self["states", source, EDGE_HEAD] = bucket + 1


def extend_token(sa: SlotRefs, token):
    """One online-construction step (`sa_reference.SuffixAutomaton.extend`) on a slot's refs."""
    n = sa["text_len"]
    cur = jnp.maximum(sa["num_states"], 1)
    last = sa["last"]
    sa["text", n] = token
    sa["states", cur, LEN] = sa["states", last, LEN] + 1
    sa["states", cur, FIRSTPOS] = n

    # 1. Add `p --token--> cur` up the suffix links until some p already has a `token` edge.
    def add_edge(carry):
        p, _, _ = carry
        bucket = sa.probe(p, token)
        missing = sa["edges", bucket, TARGET] == 0

        @pl.when(missing)
        def _():
            sa.insert(bucket, p, token, cur)

        p = jnp.where(missing, sa.parent(p), p)
        return p, bucket, missing & (p >= 0)

    p, bucket, _ = lax.while_loop(lambda c: c[2], add_edge, (last, jnp.int32(0), True))
    has_q = p >= 0
    q = jnp.where(has_q, sa["edges", bucket, TARGET], 0)
    len_p1 = sa["states", jnp.maximum(p, 0), LEN] + 1
    solid = has_q & (len_p1 == sa["states", q, LEN])
    cloning = has_q & ~solid
    clone = cur + 1
    sa["states", cur, LINK] = jnp.where(cloning, clone, jnp.where(solid, q, 0))

    # 2. Clone q (same link and first occurrence, shorter, a copy of q's edges), then redirect
    # `p --token--> q` to the clone up the suffix links.
    @pl.when(cloning)
    def _():
        sa["states", clone, LEN] = len_p1
        sa["states", clone, LINK] = sa["states", q, LINK]
        sa["states", clone, FIRSTPOS] = sa["states", q, FIRSTPOS]
        sa["states", q, LINK] = clone

        def copy_edge(edge):
            entry = edge - 1
            edge_token = sa["edges", entry, TOKEN]
            sa.insert(sa.probe(clone, edge_token), clone, edge_token, sa["edges", entry, TARGET])
            return sa["edges", entry, NEXT]

        lax.while_loop(lambda edge: edge != 0, copy_edge, sa["states", q, EDGE_HEAD])

        def redirect(carry):
            p, _ = carry
            bucket = sa.probe(p, token)
            hit = sa["edges", bucket, TARGET] == q

            @pl.when(hit)
            def _():
                sa["edges", bucket, TARGET] = clone

            p = jnp.where(hit, sa.parent(p), p)
            return p, hit & (p >= 0)

        lax.while_loop(lambda c: c[1], redirect, (p, True))

    sa["last"] = cur
    sa["num_states"] = clone + cloning.astype(jnp.int32)
    sa["text_len"] = n + 1


def lookup(sa: SlotRefs, max_ngram_size: int):
    """`(match_len, start)` of the row's next draft (`jaxspec.device.sa_state.lookup`)."""
    longest_state = sa["states", sa["last"], LINK]
    longest = sa["states", longest_state, LEN]
    if max_ngram_size == -1:
        return longest, sa["states", longest_state, FIRSTPOS] + 1
    match_len = jnp.minimum(longest, max_ngram_size)
    n = sa["text_len"]

    def read(i, s):
        return sa["edges", sa.probe(s, sa["text", n - match_len + i]), TARGET]

    matched = lax.fori_loop(0, match_len, read, jnp.int32(0))
    return match_len, sa["states", matched, FIRSTPOS] + 1


def write_draft(sa: SlotRefs, row, match_len, start, draft_ref, draft_lens_ref, *,
                draft_len: int, max_seq_len: int):
    """Writes `text[start:]` cut to `draft_len` and zero-filled into row `row`."""
    count = jnp.where(match_len > 0, jnp.minimum(draft_len, sa["text_len"] - start), 0)
    for k in range(draft_len):
        token = sa["text", jnp.minimum(start + k, max_seq_len - 1)]
        draft_ref[row, k] = jnp.where(k < count, token, 0)
    draft_lens_ref[row] = count


def _sa_extend_kernel(
    # inputs
    slots_ref,          # i32[B]
    accepted_ref,       # i32[B, W]
    num_accepted_ref,   # i32[B]
    *refs,              # 6 state inputs (aliased to the outputs, unused), then the outputs:
                        # [match_len i32[B], draft_tokens i32[B, K], draft_lens i32[B]] if lookup,
                        # then the SAState fields: states i32[S, 2N, 4], text i32[S, N],
                        # text_len, num_states, last i32[S], edges i32[S, T, 4]
    num_slots: int, max_seq_len: int, table_size: int, lookup_draft_len: int | None,
    max_ngram_size: int,
):
    outs = refs[len(STATE_FIELDS):]
    if lookup_draft_len is not None:
        (match_len_ref, draft_ref, draft_lens_ref), outs = outs[:3], outs[3:]
    row = pl.program_id(0)
    slot = slots_ref[row]
    sa = SlotRefs(outs, slot, table_size)
    # A slot at capacity drops further tokens (SAManager refuses them on the host first).
    room = max_seq_len - sa["text_len"]
    count = jnp.where(slot == num_slots, 0, jnp.minimum(num_accepted_ref[row], room))

    def extend_next(i, carry):
        extend_token(sa, accepted_ref[row, i])
        return carry

    lax.fori_loop(0, count, extend_next, jnp.int32(0))
    if lookup_draft_len is not None:
        match_len, start = lookup(sa, max_ngram_size)
        match_len_ref[row] = match_len
        write_draft(sa, row, match_len, start, draft_ref, draft_lens_ref,
                    draft_len=lookup_draft_len, max_seq_len=max_seq_len)


def static_validate(state: sa_layout.SAState, draft_len: int | None) -> None:
    """Raises NotImplementedError for inputs this kernel does not take (the switch falls back)."""
    if draft_len == 0:
        raise NotImplementedError("sa kernels need draft_len >= 1")
    if state.text.shape[0] * state.table_size >= _INT32_ELEMENTS:
        raise NotImplementedError(f"{state.text.shape[0]} slots x {state.table_size} buckets "
                                  f"overflow int32 offsets")


def extend_call(state: sa_layout.SAState, slots, accepted, num_accepted, *,
                draft_len: int | None, max_ngram_size: int, interpret: bool):
    """The `pallas_call`: extends, and with `draft_len` set also looks up.

    Returns `(state, match_len, draft_tokens, draft_lens)`, or `(state,)` without a lookup.
    """
    static_validate(state, draft_len)
    leaves = [getattr(state, name) for name in STATE_FIELDS]
    rows = slots.shape[0]
    draft_shapes = [] if draft_len is None else [
        jax.ShapeDtypeStruct((rows,), jnp.int32),
        jax.ShapeDtypeStruct((rows, draft_len), jnp.int32),
        jax.ShapeDtypeStruct((rows,), jnp.int32)]
    num_drafts = len(draft_shapes)
    kernel = functools.partial(
        _sa_extend_kernel, num_slots=state.num_slots, max_seq_len=state.max_seq_len,
        table_size=state.table_size, lookup_draft_len=draft_len, max_ngram_size=max_ngram_size)
    outs = pl.pallas_call(
        kernel,
        grid=(rows,),
        out_shape=draft_shapes + [jax.ShapeDtypeStruct(x.shape, x.dtype) for x in leaves],
        input_output_aliases={3 + i: num_drafts + i for i in range(len(leaves))},
        compiler_params=plgpu.CompilerParams(num_warps=NUM_WARPS, num_stages=NUM_STAGES),
        interpret=interpret,
        name=f"sa_extend_{draft_len=}_{max_ngram_size=}",
    )(slots, accepted, num_accepted, *leaves)
    new_state = sa_layout.SAState(**dict(zip(STATE_FIELDS, outs[num_drafts:], strict=True)))
    return (new_state, *outs[:num_drafts])


@functools.partial(jax.jit, static_argnames=("draft_len", "max_ngram_size", "interpret"),
                   donate_argnums=0)
def sa_extend_and_lookup(state: sa_layout.SAState, slots, accepted, num_accepted, *,
                         draft_len: int, max_ngram_size: int = -1, interpret: bool = False):
    """`jaxspec.device.sa_state.extend_and_lookup` as a Pallas kernel (same arguments and
    results).

    Args:
      interpret: run the kernel in the Pallas interpreter (any backend; slow, for tests).

    Raises:
      NotImplementedError: for `draft_len == 0` or tables beyond int32 offsets.
    """
    sa_layout.validate_batch(slots, accepted, num_accepted, draft_len, max_ngram_size)
    return extend_call(state, slots, accepted, num_accepted, draft_len=draft_len,
                       max_ngram_size=max_ngram_size, interpret=interpret)
