"""The XLA reference: layout, in-place updates, capacity, compile counts and validation.

Property tests against the brute-force oracle, shared with the Pallas kernels, live in
tests/pallas_kernels/sa_kernels_test.py.
"""

import re

from absl.testing import absltest
from absl.testing import parameterized
import chex
import jax
import jax.numpy as jnp
import numpy as np

from jaxspec import sa_layout
from jaxspec.device import sa_global
from jaxspec.device import sa_state
from jaxspec.host import sa_build
from jaxspec.host import sa_reference


def _batch(rows):
    """[(slot, tokens)] -> slots, accepted (zero-padded), num_accepted."""
    width = max(1, max(len(t) for _, t in rows))
    accepted = np.zeros((len(rows), width), np.int32)
    for b, (_, tokens) in enumerate(rows):
        accepted[b, :len(tokens)] = tokens
    return (jnp.asarray([s for s, _ in rows], jnp.int32), jnp.asarray(accepted),
            jnp.asarray([len(t) for _, t in rows], jnp.int32))


def _assert_slot_equal(device_slot, host_slot):
    for name in sa_layout.SAState.__dataclass_fields__:
        np.testing.assert_array_equal(np.asarray(getattr(device_slot, name)),
                                      getattr(host_slot, name), err_msg=name)


class SAStateTest(parameterized.TestCase):

    def test_sizes(self):
        self.assertEqual(sa_layout.table_size(1), 8)
        self.assertEqual(sa_layout.table_size(1000), 4000)
        # 4 state arrays of 2n, the text, 4 tables of 4n, 3 scalars; 4 bytes each.
        self.assertEqual(sa_layout.bytes_per_slot(1000), 100 * 1000 + 12)
        state = sa_layout.init_state(3, 50)
        self.assertEqual(state.num_slots, 3)
        self.assertEqual(state.text.shape, (4, 50))
        self.assertEqual(sum(a.nbytes for a in jax.tree.leaves(state)),
                         4 * sa_layout.bytes_per_slot(50))
        self.assertFalse(any(a.any() for a in jax.tree.leaves(state)))

    @parameterized.parameters(1, 2, 5)
    def test_extend_token_by_token_equals_host_build(self, chunk):
        tokens = [int(x) for x in np.random.default_rng(chunk).integers(0, 3, 60)]
        state = sa_layout.init_state(2, 64)
        for i in range(0, len(tokens), chunk):
            state, *_ = sa_state.extend_and_lookup(state, *_batch([(1, tokens[i:i + chunk])]),
                                                   draft_len=2)
        _assert_slot_equal(state.slot(1), sa_build.build(tokens, 64))
        _assert_slot_equal(state.slot(0), sa_layout.zeros(64, xp=np))

    def test_host_build_then_extend(self):
        tokens = [int(x) for x in np.random.default_rng(7).integers(0, 4, 50)]
        state = sa_state.write_slot(sa_layout.init_state(2, 64), jnp.int32(0),
                                    sa_build.build(tokens[:30], 64))
        state, match_len, draft, lens = sa_state.extend_and_lookup(
            state, *_batch([(0, tokens[30:34])]), draft_len=3)
        for i in range(34, 50, 2):
            state, match_len, draft, lens = sa_state.extend_and_lookup(
                state, *_batch([(0, tokens[i:i + 2])]), draft_len=3)
        _assert_slot_equal(state.slot(0), sa_build.build(tokens, 64))
        expected = sa_reference.naive_draft(tokens, 3)
        self.assertEqual((int(match_len[0]), draft[0, :lens[0]].tolist()), expected)

    @parameterized.parameters(-1, 2)
    def test_dummy_rows_extend_nothing_and_match_nothing(self, max_ngram_size):
        state = sa_layout.init_state(2, 16)
        dummy = state.num_slots
        slots, accepted, num_accepted = _batch([(dummy, [1, 1, 1]), (0, [1, 1, 1]),
                                                (dummy, [1, 1, 1])])
        state, match_len, draft, lens = sa_state.extend_and_lookup(
            state, slots, accepted, num_accepted, draft_len=2, max_ngram_size=max_ngram_size)
        np.testing.assert_array_equal(match_len, [0, 2, 0])
        np.testing.assert_array_equal(draft, [[0, 0], [1, 0], [0, 0]])
        np.testing.assert_array_equal(lens, [0, 1, 0])
        _assert_slot_equal(state.slot(dummy), sa_layout.zeros(16, xp=np))

    def test_padding_rows_do_not_change_results(self):
        rows = [(0, [1, 2, 1, 2]), (1, [3, 3, 3])]
        padded = rows + [(2, [5, 5])] * 3
        a, *outs_a = sa_state.extend_and_lookup(sa_layout.init_state(2, 16), *_batch(rows),
                                                draft_len=3)
        b, *outs_b = sa_state.extend_and_lookup(sa_layout.init_state(2, 16), *_batch(padded),
                                                draft_len=3)
        for x, y in zip(outs_a, outs_b, strict=True):
            np.testing.assert_array_equal(x, y[:2])
        chex.assert_trees_all_equal(a, b)

    def test_capacity_drops_tokens_without_corruption(self):
        tokens = [0, 1, 0, 1, 1, 0]
        state = sa_layout.init_state(1, 4)
        state, *_ = sa_state.extend_and_lookup(state, *_batch([(0, tokens)]), draft_len=2)
        _assert_slot_equal(state.slot(0), sa_build.build(tokens[:4], 4))
        state, *_ = sa_state.extend_and_lookup(state, *_batch([(0, [1])]), draft_len=2)
        _assert_slot_equal(state.slot(0), sa_build.build(tokens[:4], 4))

    @parameterized.parameters(1, 3)
    def test_donated_state_is_updated_in_place(self, batch):
        state = sa_layout.init_state(4, 32)
        pointers = [a.unsafe_buffer_pointer() for a in jax.tree.leaves(state)]
        rows = [(b, [1, 2, 1]) for b in range(batch)]
        state, *_ = sa_state.extend_and_lookup(state, *_batch(rows), draft_len=2)
        self.assertEqual([a.unsafe_buffer_pointer() for a in jax.tree.leaves(state)], pointers)

    @parameterized.product(batch=[1, 3], global_pool=[False, True])
    def test_compiled_step_never_copies_slot_arrays(self, batch, global_pool):
        # A copy of an [S, ...] array inside the loops would make every step O(max_seq_len).
        state = sa_layout.init_state(4, 256)
        args = _batch([(b, [1, 2]) for b in range(batch)])
        if global_pool:
            lowered = sa_global.extend_and_global_search.lower(
                state, *args, jnp.ones(5, jnp.bool_), draft_len=3)
        else:
            lowered = sa_state.extend_and_lookup.lower(state, *args, draft_len=3,
                                                       max_ngram_size=2)
        hlo = lowered.compile().as_text()
        copies = re.findall(r"= s32\[5,[\d,]+\]\{[\d,]+\} copy\(", hlo)
        self.assertEmpty(copies)

    def test_compile_count(self):
        def step(state, slots, accepted, num_accepted, draft_len):
            return sa_state.extend_and_lookup(state, slots, accepted, num_accepted,
                                              draft_len=draft_len)

        step = jax.jit(chex.assert_max_traces(step, n=2), static_argnames="draft_len",
                       donate_argnums=0)
        state = sa_layout.init_state(2, 32)
        for draft_len in (2, 4):  # two buckets, each driven twice with new values
            for tokens in ([1, 2, 1], [2]):
                slots, _, num_accepted = _batch([(0, tokens)])
                accepted = jnp.zeros((1, draft_len + 1), jnp.int32).at[0, :len(tokens)].set(
                    jnp.asarray(tokens, jnp.int32))
                state, *_ = step(state, slots, accepted, num_accepted, draft_len=draft_len)
        chex.clear_trace_counter()

    def test_eval_shape(self):
        state = jax.eval_shape(lambda: sa_layout.init_state(3, 128))
        for draft_len in (1, 4, 8):
            out = jax.eval_shape(
                lambda st, s, a, n, k=draft_len: sa_state.extend_and_lookup(st, s, a, n,
                                                                            draft_len=k),
                state, jax.ShapeDtypeStruct((5,), jnp.int32),
                jax.ShapeDtypeStruct((5, draft_len + 1), jnp.int32),
                jax.ShapeDtypeStruct((5,), jnp.int32))
            chex.assert_trees_all_equal_shapes_and_dtypes(out[0], state)
            self.assertEqual([x.shape for x in out[1:]], [(5,), (5, draft_len), (5,)])

    @parameterized.named_parameters(
        dict(testcase_name="slots_dtype", change=dict(slots=np.zeros(2, np.uint32)),
             error=TypeError, match="slots must be int32"),
        dict(testcase_name="accepted_rank", change=dict(accepted=np.zeros(2, np.int32)),
             error=ValueError, match="accepted"),
        dict(testcase_name="rows", change=dict(num_accepted=np.zeros(3, np.int32)),
             error=ValueError, match=r"\(3,\)"),
        dict(testcase_name="draft_len", change=dict(draft_len=-1), error=ValueError,
             match="draft_len must be >= 0, got -1"),
        dict(testcase_name="ngram", change=dict(max_ngram_size=0), error=ValueError,
             match="max_ngram_size .* got 0"),
    )
    def test_validation(self, change, error, match):
        args = dict(slots=np.zeros(2, np.int32), accepted=np.zeros((2, 3), np.int32),
                    num_accepted=np.zeros(2, np.int32), draft_len=2, max_ngram_size=-1)
        args.update(change)
        with self.assertRaisesRegex(error, match):
            sa_state.extend_and_lookup(sa_layout.init_state(2, 8), **args)

    @parameterized.parameters(0, -1)
    def test_bad_init(self, bad):
        with self.assertRaisesRegex(ValueError, str(bad)):
            sa_layout.init_state(bad, 8)
        with self.assertRaisesRegex(ValueError, str(bad)):
            sa_layout.init_state(1, bad)


if __name__ == "__main__":
    absltest.main()
