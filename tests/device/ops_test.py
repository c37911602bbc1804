"""The implementation switch (`jaxspec.device.ops`): the reference on CPU, the forced kernel's
`NotImplementedError`, the fallback, bad names, and use inside a caller's jit."""

import functools
from unittest import mock

from absl.testing import absltest
from absl.testing import parameterized
import jax
import jax.numpy as jnp

from jaxspec import sa_layout
from jaxspec.device import ops
from jaxspec.device import sa_state
from jaxspec.host import sa_build
from tests.helpers import draft_rows


def _args(draft_len):
    """Slot 0 holds [1, 2, 1]; one row extends it by [2]: the text [1, 2, 1, 2] drafts [1, 2]."""
    state = sa_state.write_slot(sa_layout.init_state(2, 16), jnp.int32(0),
                                sa_build.build([1, 2, 1], 16))
    batch = (jnp.asarray([0], jnp.int32), jnp.asarray([[2]], jnp.int32),
             jnp.asarray([1], jnp.int32))
    return (state, *batch), dict(draft_len=draft_len)



class ImplementationSwitchTest(parameterized.TestCase):

    @parameterized.parameters(None, "xla")
    def test_cpu_runs_the_reference(self, implementation):
        args, kwargs = _args(2)
        _, *outs = ops.sa_extend_and_lookup(*args, **kwargs, implementation=implementation)
        self.assertEqual(draft_rows(*outs), [(2, [1, 2])])
        args, kwargs = _args(2)
        _, *outs = ops.sa_extend_and_global_search(
            *args, jnp.ones(3, jnp.bool_), **kwargs, implementation=implementation)
        self.assertEqual(draft_rows(*outs), [(2, [1, 2])])

    def test_forced_pallas_raises_not_implemented(self):
        args, kwargs = _args(0)
        with self.assertRaisesRegex(NotImplementedError, "draft_len >= 1"):
            ops.sa_extend_and_lookup(*args, **kwargs, implementation="pallas")

    def test_auto_falls_back_to_the_reference(self):
        # Pretend to be on a GPU: draft_len=0 is not implemented by the kernel, so the switch
        # must run the reference (which would fail to compile the kernel on CPU otherwise).
        args, kwargs = _args(0)
        with mock.patch.object(jax, "default_backend", return_value="gpu"):
            _, match_len, draft, lens = ops.sa_extend_and_lookup(*args, **kwargs)
        self.assertEqual((int(match_len[0]), draft.shape, int(lens[0])), (2, (1, 0), 0))

    def test_bad_implementation(self):
        args, kwargs = _args(2)
        with self.assertRaisesRegex(ValueError, "'triton'"):
            ops.sa_extend_and_lookup(*args, **kwargs, implementation="triton")

    def test_traceable_inside_a_callers_jit(self):
        @functools.partial(jax.jit, static_argnames="implementation")
        def step(state, slots, accepted, num_accepted, implementation):
            return ops.sa_extend_and_lookup(state, slots, accepted, num_accepted, draft_len=2,
                                            implementation=implementation)

        args, _ = _args(2)
        _, *outs = step(*args, implementation=None)
        self.assertEqual(draft_rows(*outs), [(2, [1, 2])])


if __name__ == "__main__":
    absltest.main()
