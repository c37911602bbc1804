"""Global pool search, XLA reference: masks, the suffix cap, dummy rows and validation.

The ranking cases and the randomised comparison with the brute-force oracle (shared with the
Pallas kernel) live in tests/pallas_kernels/sa_kernels_test.py.
"""

from absl.testing import absltest
from absl.testing import parameterized
import jax
import jax.numpy as jnp
import numpy as np

from jaxspec import sa_layout
from jaxspec.device import sa_global
from jaxspec.device import sa_state
from jaxspec.host import sa_build


def _pool(texts, max_seq_len=80):
    state = sa_layout.init_state(len(texts), max_seq_len)
    for slot, text in enumerate(texts):
        state = sa_state.write_slot(state, jnp.int32(slot), sa_build.build(text, max_seq_len))
    return state


def _search(state, slots, active, draft_len=2, max_ngram_size=-1):
    """Searches without extending; the state is donated, so it works on a copy."""
    slots = jnp.asarray(slots, jnp.int32)
    state = jax.tree.map(jnp.copy, state)
    _, match_len, draft, lens = sa_global.extend_and_global_search(
        state, slots, jnp.zeros((len(slots), 1), jnp.int32), jnp.zeros(len(slots), jnp.int32),
        jnp.asarray(active, jnp.bool_), draft_len=draft_len, max_ngram_size=max_ngram_size)
    return [(int(m), d[:n].tolist()) for m, d, n in zip(match_len, draft, lens, strict=True)]


class GlobalSearchTest(parameterized.TestCase):

    def test_inactive_slots_are_not_searched(self):
        state = _pool([[1, 2, 5, 6, 7, 8], [9, 1, 2, 3, 1, 2]])
        self.assertEqual(_search(state, [1], [True, False, False]), [(2, [5, 6])])
        self.assertEqual(_search(state, [1], [False, False, False]), [(0, [])])

    def test_suffix_cap(self):
        block = [i % 5 + (i // 5) * 7 for i in range(70)]
        state = _pool([block + [99], block])
        self.assertEqual(_search(state, [1], [True, True, False], draft_len=1), [(64, [99])])
        self.assertEqual(_search(state, [1], [True, True, False], draft_len=1,
                                 max_ngram_size=3), [(3, [99])])

    def test_dummy_rows_match_nothing(self):
        state = _pool([[1, 1, 1], [1, 1]])
        dummy = state.num_slots
        self.assertEqual(_search(state, [dummy, 0, dummy], [True, True, True]),
                         [(0, []), (2, [1]), (0, [])])

    @parameterized.named_parameters(
        dict(testcase_name="mask_shape", mask=np.ones(2, np.bool_), ngram=-1,
             match=r"bool\[3\]"),
        dict(testcase_name="mask_dtype", mask=np.ones(3, np.int32), ngram=-1,
             match=r"bool\[3\]"),
        dict(testcase_name="ngram_cap", mask=np.ones(3, np.bool_), ngram=65, match="65"),
    )
    def test_validation(self, mask, ngram, match):
        with self.assertRaisesRegex(ValueError, match):
            sa_global.extend_and_global_search(
                sa_layout.init_state(2, 8), np.zeros(1, np.int32), np.zeros((1, 2), np.int32),
                np.zeros(1, np.int32), mask, draft_len=2, max_ngram_size=ngram)


if __name__ == "__main__":
    absltest.main()
