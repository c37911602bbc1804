"""The numba host builder against the pure-Python reference automaton."""

from absl.testing import absltest
from absl.testing import parameterized
import hypothesis
from hypothesis import strategies as st
import jax
import numpy as np

from jaxspec import sa_layout
from jaxspec.host import sa_build
from jaxspec.host import sa_reference

_SETTINGS = hypothesis.settings(max_examples=100, deadline=None, derandomize=True)


def _texts(max_size=48):
    return st.integers(2, 4).flatmap(
        lambda v: st.lists(st.integers(0, v - 1), min_size=0, max_size=max_size))


def _edges(slot: sa_layout.SAState, s: int) -> dict[int, int]:
    """State `s`'s transitions, read through its edge list."""
    edges, edge = {}, int(slot.states[s, sa_layout.EDGE_HEAD])
    while edge:
        source, token, target, edge = (int(x) for x in slot.edges[edge - 1])
        assert source == s, (s, edge)
        edges[token] = target
    return edges


class BuildTest(parameterized.TestCase):

    @hypothesis.given(tokens=_texts(), spare=st.integers(0, 5))
    @_SETTINGS
    def test_equals_reference(self, tokens, spare):
        slot = sa_build.build(tokens, len(tokens) + spare + 1)
        ref = sa_reference.SuffixAutomaton(tokens)
        n = ref.num_states
        self.assertEqual(int(slot.num_states), n)
        self.assertEqual(int(slot.last), ref.last)
        self.assertEqual(int(slot.text_len), len(tokens))
        np.testing.assert_array_equal(slot.text[:len(tokens)], tokens)
        np.testing.assert_array_equal(slot.states[:n, sa_layout.LEN], ref.len)
        np.testing.assert_array_equal(slot.states[:n, sa_layout.LINK], [0] + ref.link[1:])
        np.testing.assert_array_equal(slot.states[:n, sa_layout.FIRSTPOS],
                                      [0] + ref.firstpos[1:])
        self.assertEqual([_edges(slot, s) for s in range(n)], ref.next)
        # Nothing is written past the used states and text.
        self.assertFalse(slot.states[n:].any() or slot.text[len(tokens):].any())

    @hypothesis.given(tokens=_texts())
    @_SETTINGS
    def test_every_edge_is_found_by_probing(self, tokens):
        slot = sa_build.build(tokens, max(1, len(tokens)))
        for bucket in np.flatnonzero(slot.edges[:, sa_layout.TARGET]):
            source, token = (int(x) for x in slot.edges[bucket, :sa_layout.TARGET])
            probe = int(sa_layout.hash_bucket(np.int32(source), np.int32(token), slot.table_size))
            while probe != bucket:
                # Linear probing: every bucket between the hash and the edge is occupied.
                self.assertNotEqual(int(slot.edges[probe, sa_layout.TARGET]), 0)
                probe = (probe + 1) % slot.table_size

    def test_layout_size(self):
        slot = sa_build.build([1, 2, 3], 100)
        self.assertEqual(sum(np.asarray(a).nbytes for a in jax.tree.leaves(slot)),
                         sa_layout.bytes_per_slot(100))
        self.assertEqual(slot.table_size, 400)
        self.assertEqual(slot.states.shape, (200, 4))
        self.assertEqual(slot.edges.shape, (400, 4))

    def test_large_alphabet_at_capacity(self):
        tokens = np.random.default_rng(0).integers(0, 200_000, 3000)
        slot = sa_build.build(tokens, 3000)
        ref = sa_reference.SuffixAutomaton(tokens.tolist())
        np.testing.assert_array_equal(slot.states[1:ref.num_states, sa_layout.FIRSTPOS],
                                      ref.firstpos[1:])

    @parameterized.named_parameters(
        dict(testcase_name="too_long", tokens=[1, 2, 3], max_seq_len=2, match="max_seq_len=2"),
        dict(testcase_name="not_int", tokens=[1.5], max_seq_len=2, match="float"),
        dict(testcase_name="two_dims", tokens=[[1]], max_seq_len=2, match="1-D"),
        dict(testcase_name="overflow", tokens=[2**31], max_seq_len=2, match="int32"),
    )
    def test_bad_input(self, tokens, max_seq_len, match):
        with self.assertRaisesRegex(ValueError, match):
            sa_build.build(tokens, max_seq_len)


if __name__ == "__main__":
    absltest.main()
