"""Exact-match acceptance: hand-computed cases."""

from absl.testing import parameterized
import jax.numpy as jnp
import numpy as np

from jaxspec.device import verify


class AcceptTest(parameterized.TestCase):

    @parameterized.named_parameters(
        # drafts, draft_len, target, committed, num_new
        dict(testcase_name="all_accepted", drafts=[5, 6, 7], n=3, target=[5, 6, 7, 8],
             committed=[5, 6, 7, 8], num_new=4),
        dict(testcase_name="first_rejected", drafts=[5, 6, 7], n=3, target=[9, 6, 7, 8],
             committed=[9, 0, 0, 0], num_new=1),
        dict(testcase_name="middle_rejected", drafts=[5, 6, 7], n=3, target=[5, 1, 7, 8],
             committed=[5, 1, 0, 0], num_new=2),
        # A later match after a mismatch does not count: acceptance is a prefix.
        dict(testcase_name="prefix_only", drafts=[5, 6, 7], n=3, target=[5, 0, 7, 8],
             committed=[5, 0, 0, 0], num_new=2),
        # Padding past the real draft length is never accepted, even when it equals the target.
        dict(testcase_name="padding_never_accepted", drafts=[5, 0, 0], n=1, target=[5, 0, 0, 3],
             committed=[5, 0, 0, 0], num_new=2),
        dict(testcase_name="no_drafts", drafts=[0, 0, 0], n=0, target=[0, 4, 4, 4],
             committed=[0, 0, 0, 0], num_new=1),
    )
    def test_accept(self, drafts, n, target, committed, num_new):
        tokens, count = verify.accept(jnp.asarray([drafts], jnp.int32),
                                      jnp.asarray([n], jnp.int32),
                                      jnp.asarray([target], jnp.int32))
        np.testing.assert_array_equal(np.asarray(tokens[0]), committed)
        assert int(count[0]) == num_new

    def test_zero_k(self):
        tokens, count = verify.accept(jnp.zeros((2, 0), jnp.int32), jnp.zeros(2, jnp.int32),
                                      jnp.asarray([[3], [4]], jnp.int32))
        np.testing.assert_array_equal(np.asarray(tokens), [[3], [4]])
        np.testing.assert_array_equal(np.asarray(count), [1, 1])
