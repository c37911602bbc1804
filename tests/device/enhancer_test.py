"""The enhancer: whole-row override at match_len >= threshold, hand-computed cases."""

from absl.testing import parameterized
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxspec.device import enhancer

NEURAL = [[1, 2, 3], [4, 5, 6], [7, 8, 9], [10, 11, 12]]
SA = [[21, 22, 0], [24, 25, 26], [27, 0, 0], [30, 31, 32]]


def _enhance(neural, sa, match_len, threshold):
    return np.asarray(enhancer.enhance(jnp.asarray(neural, jnp.int32),
                                       jnp.asarray(sa, jnp.int32),
                                       jnp.asarray(match_len, jnp.int32), threshold=threshold))


class EnhanceTest(parameterized.TestCase):

    @parameterized.named_parameters(
        # Just below, at, and above the threshold; at counts (>=), as in TensorRT-LLM.
        dict(testcase_name="boundary", match_len=[3, 4, 5, 0], threshold=4,
             expected=[NEURAL[0], SA[1], SA[2], NEURAL[3]]),
        # The whole row is replaced, zero tail included: no splicing past the SA continuation.
        dict(testcase_name="whole_row_with_zero_tail", match_len=[9, 0, 9, 0], threshold=4,
             expected=[SA[0], NEURAL[1], SA[2], NEURAL[3]]),
        dict(testcase_name="none_match", match_len=[0, 1, 2, 3], threshold=4, expected=NEURAL),
        dict(testcase_name="threshold_one", match_len=[1, 0, 1, 0], threshold=1,
             expected=[SA[0], NEURAL[1], SA[2], NEURAL[3]]),
    )
    def test_override(self, match_len, threshold, expected):
        np.testing.assert_array_equal(_enhance(NEURAL, SA, match_len, threshold), expected)

    def test_zero_draft_length(self):
        out = _enhance(np.zeros((2, 0)), np.zeros((2, 0)), [5, 0], 4)
        self.assertEqual(out.shape, (2, 0))

    def test_jits_with_static_threshold(self):
        fn = jax.jit(enhancer.enhance, static_argnames=("threshold",))
        out = fn(jnp.asarray(NEURAL, jnp.int32), jnp.asarray(SA, jnp.int32),
                 jnp.asarray([4, 3, 4, 3], jnp.int32), threshold=4)
        np.testing.assert_array_equal(np.asarray(out), [SA[0], NEURAL[1], SA[2], NEURAL[3]])
        self.assertEqual(out.dtype, jnp.int32)

    @parameterized.named_parameters(
        dict(testcase_name="threshold_zero", kwargs=dict(threshold=0), match="threshold"),
        dict(testcase_name="threshold_bool", kwargs=dict(threshold=True), match="threshold"),
        dict(testcase_name="shape_mismatch", kwargs=dict(sa=[[1, 2]] * 4), match="drafts"),
        dict(testcase_name="match_len_shape", kwargs=dict(match_len=[1, 2]), match="match_len"),
    )
    def test_bad_arguments(self, kwargs, match):
        args = dict(neural=NEURAL, sa=SA, match_len=[0, 0, 0, 0], threshold=4) | kwargs
        with pytest.raises(ValueError, match=match):
            _enhance(**args)
