"""Pallas Triton kernels: extend each row's automaton, then search the global pool for its draft.

Reference (bit-identical results, and the CPU path):
`jaxspec.device.sa_global.extend_and_global_search`; semantics in `jaxspec.host.sa_reference`
(`global_draft`).

Two launches, as in TensorRT-LLM (the launch boundary is the barrier between extending and
searching): `sa_extend.extend_call` without a lookup, then one program per row that walks every
active slot in turn with the matching-statistics walk and keeps the best candidate by

    longer match > own slot > longer continuation > lower slot index.
"""

import functools

import jax
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu
import jax.numpy as jnp

from jaxspec import sa_layout
from jaxspec.pallas_kernels import sa_extend

LEN, LINK, FIRSTPOS = sa_layout.LEN, sa_layout.LINK, sa_layout.FIRSTPOS
SOURCE, TOKEN, TARGET = sa_layout.SOURCE, sa_layout.TOKEN, sa_layout.TARGET


def _sa_global_search_kernel(
    # inputs
    slots_ref,          # i32[B]
    active_ref,         # i32[S] 1 = searched
    *refs,              # the SAState fields (read only), then the outputs:
                        # match_len i32[B], draft_tokens i32[B, K], draft_lens i32[B]
    num_slots: int, max_seq_len: int, table_size: int, draft_len: int, cap: int,
):
    state_refs = refs[:len(sa_extend.STATE_FIELDS)]
    match_len_ref, draft_ref, draft_lens_ref = refs[len(sa_extend.STATE_FIELDS):]
    row = pl.program_id(0)
    own_slot = slots_ref[row]
    own = sa_extend.SlotRefs(state_refs, own_slot, table_size)
    own_len = own["text_len"]
    query_len = jnp.minimum(own_len, cap)
    query_start = own_len - query_len

    def search(slot, best):
        sa = sa_extend.SlotRefs(state_refs, slot, table_size)

        # Matching statistics, one bucket probe per iteration (as the reference's lanes).
        def walk(carry):
            s, matched, i, bucket = carry
            token = own["text", query_start + jnp.minimum(i, query_len - 1)]
            target = sa["edges", bucket, TARGET]
            hit = (target != 0) & (sa["edges", bucket, SOURCE] == s) & (
                sa["edges", bucket, TOKEN] == token)
            miss = target == 0
            drop = miss & (s != 0)
            advance = hit | (miss & (s == 0))
            s = jnp.where(hit, target, jnp.where(drop, sa["states", s, LINK], s))
            matched = jnp.where(hit, matched + 1,
                                jnp.where(drop, sa["states", s, LEN],
                                          jnp.where(miss, 0, matched)))
            i = i + advance.astype(jnp.int32)
            next_token = own["text", query_start + jnp.minimum(i, query_len - 1)]
            bucket = jnp.where(advance | drop, sa_layout.hash_bucket(s, next_token, table_size),
                               sa_layout.next_bucket(bucket, table_size))
            return s, matched, i, bucket

        first = sa_layout.hash_bucket(jnp.int32(0), own["text", query_start], table_size)
        s, matched, _, _ = lax.while_loop(lambda c: c[2] < query_len, walk,
                                          (jnp.int32(0), jnp.int32(0), jnp.int32(0), first))
        slot_len = sa["text_len"]

        def stuck(carry):
            s, _ = carry
            return (s != 0) & (sa["states", s, FIRSTPOS] + 1 >= slot_len)

        def fall_back(carry):
            s, _ = carry
            s = sa["states", s, LINK]
            return s, sa["states", s, LEN]

        s, matched = lax.while_loop(stuck, fall_back, (s, matched))
        start = sa["states", s, FIRSTPOS] + 1
        is_own = (slot == own_slot).astype(jnp.int32)
        continuation = slot_len - start
        best_len, best_own, best_cont, best_slot, best_start = best
        # Strictly better only, scanning slots upwards: full ties keep the lower slot index.
        better = (s != 0) & (
            (matched > best_len)
            | ((matched == best_len)
               & ((is_own > best_own) | ((is_own == best_own) & (continuation > best_cont)))))
        chosen = (matched, is_own, continuation, slot, start)
        return tuple(jnp.where(better, new, old) for new, old in zip(chosen, best, strict=True))

    def visit(slot, best):
        searched = (active_ref[slot] != 0) & (query_len > 0)
        return lax.cond(searched, search, lambda _, b: b, slot, best)

    zero = jnp.int32(0)
    best_len, _, _, best_slot, best_start = lax.fori_loop(
        0, num_slots + 1, visit, (zero, zero, jnp.int32(-1), zero, zero))
    match_len_ref[row] = best_len
    winner = sa_extend.SlotRefs(state_refs, best_slot, table_size)
    sa_extend.write_draft(winner, row, best_len, best_start, draft_ref, draft_lens_ref,
                          draft_len=draft_len, max_seq_len=max_seq_len)


def global_search_call(state: sa_layout.SAState, slots, active_mask, *, draft_len: int,
                       max_ngram_size: int, interpret: bool):
    """The search `pallas_call`: `(match_len, draft_tokens, draft_lens)`."""
    sa_extend.static_validate(state, draft_len)
    rows = slots.shape[0]
    cap = sa_layout.suffix_cap(max_ngram_size)
    kernel = functools.partial(
        _sa_global_search_kernel, num_slots=state.num_slots, max_seq_len=state.max_seq_len,
        table_size=state.table_size, draft_len=draft_len, cap=cap)
    return pl.pallas_call(
        kernel,
        grid=(rows,),
        out_shape=[jax.ShapeDtypeStruct((rows,), jnp.int32),
                   jax.ShapeDtypeStruct((rows, draft_len), jnp.int32),
                   jax.ShapeDtypeStruct((rows,), jnp.int32)],
        compiler_params=plgpu.CompilerParams(num_warps=sa_extend.NUM_WARPS,
                                             num_stages=sa_extend.NUM_STAGES),
        interpret=interpret,
        name=f"sa_global_search_{draft_len=}_{cap=}",
    )(slots, active_mask.astype(jnp.int32),
      *[getattr(state, name) for name in sa_extend.STATE_FIELDS])


@functools.partial(jax.jit, static_argnames=("draft_len", "max_ngram_size", "interpret"),
                   donate_argnums=0)
def sa_extend_and_global_search(state: sa_layout.SAState, slots, accepted, num_accepted,
                                active_mask, *, draft_len: int, max_ngram_size: int = -1,
                                interpret: bool = False):
    """`jaxspec.device.sa_global.extend_and_global_search` as Pallas kernels (same arguments
    and results).

    Args:
      interpret: run the kernels in the Pallas interpreter (any backend; slow, for tests).

    Raises:
      NotImplementedError: for `draft_len == 0` or tables beyond int32 offsets.
    """
    sa_layout.validate_batch(slots, accepted, num_accepted, draft_len, max_ngram_size)
    sa_layout.validate_mask(state, active_mask, max_ngram_size)
    sa_extend.static_validate(state, draft_len)
    (state,) = sa_extend.extend_call(state, slots, accepted, num_accepted, draft_len=None,
                                     max_ngram_size=max_ngram_size, interpret=interpret)
    return (state, *global_search_call(state, slots, active_mask, draft_len=draft_len,
                                       max_ngram_size=max_ngram_size, interpret=interpret))
